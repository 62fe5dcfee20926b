"""Files the library and the training application share: safetensors reading and writing (safetensors.py),
writes that are never half-done (atomic_write.py), regular-file checks (file_checks.py), the memory left to the
process (memory.py), the layout of a run's checkpoint folders (checkpoints.py), the finiteness check before weights
or optimizer state are saved (finite.py), and where a long text may be cut so that a tokenizer reads it in pieces
(text_pieces.py)."""
