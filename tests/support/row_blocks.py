"""The block size of the fast ops' row blocks (fast/row_blocks.py), set by a test: blocks down to one row, so
blocks split sequences and every thread gets some."""
import contextlib

from hypothesis import strategies as st

from tinygrad_ssm.fast import row_blocks

BLOCKS = st.sampled_from([1, 40, 64 * 1024])   # one row or step per block, a few, all in one


@contextlib.contextmanager
def block_bytes(n):
    """Blocks of about n bytes of one array's rows (1 = one row per block) while the ops run."""
    before, row_blocks.BLOCK_BYTES = row_blocks.BLOCK_BYTES, n
    try:
        yield
    finally:
        row_blocks.BLOCK_BYTES = before
