"""Files the library and the training application share: safetensors reading and writing (safetensors.py),
writes that are never half-done (atomic_write.py), regular-file checks (file_checks.py), the memory left to the
process (memory.py), and the layout of a run's checkpoint folders (checkpoints.py)."""
