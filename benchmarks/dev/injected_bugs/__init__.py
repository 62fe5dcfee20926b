"""Lists of bugs for benchmarks/dev/inject_bugs.py: one module an area, each a BUGS list of Bug(...)."""
