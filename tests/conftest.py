"""Hypothesis profiles: `ci` (derandomized, few examples, no deadline) when CI is set, else `dev` (thorough).
Choose one by hand with HYPOTHESIS_PROFILE=dev|ci. And the fixtures tests in several folders share (plain helper
functions are in tests/support/)."""
import os
import shutil

import pytest
from hypothesis import HealthCheck, settings

from tests.support.training import TINY, quiet

settings.register_profile("ci", max_examples=15, derandomize=True, deadline=None, print_blob=True,
                          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
settings.register_profile("dev", max_examples=100, deadline=None,
                          suppress_health_check=[HealthCheck.too_slow])
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci" if os.environ.get("CI") else "dev"))


@pytest.fixture(scope="session")
def corpus(tmp_path_factory):
    """A text file to train on: 300 numbered lines (~16 KB), enough for a tiny model's batches and its validation
    split. Tests only read it."""
    path = tmp_path_factory.mktemp("data") / "corpus.txt"
    path.write_bytes(b"".join(b"line %d: the quick brown fox jumps over the lazy dog\n" % i for i in range(300)))
    return path


@pytest.fixture(scope="module")
def stopped_run(corpus, tmp_path_factory):
    """A tiny run (tests/support/training.py's TINY) of 3 steps stopped after step 2: checkpoints at 1 and 2.
    Trained once per test module; tests change only their copy of it (`run`)."""
    from tinygrad_ssm.train.loop import TrainConfig, train
    out = tmp_path_factory.mktemp("runs") / "run"
    result = train(TrainConfig(**TINY, steps=3, data=str(corpus), out=str(out)), stop_at=2, progress=False,
                   say=quiet)
    assert result.status == "stopped" and result.step == 2
    return out


@pytest.fixture
def run(stopped_run, tmp_path):
    """A copy of the stopped run for one test to change."""
    copy = tmp_path / "run"
    shutil.copytree(stopped_run, copy, symlinks=True)
    return copy


@pytest.fixture(scope="session")
def bpe_tokenizer(corpus, tmp_path_factory):
    """A byte-level BPE tokenizer.json (320 tokens, EOS <|endoftext|> = 0) trained in the test on a few files of the
    bundled corpus (the standard library's) and the test corpus: no download."""
    from tests.support.tokenizers import corpus_texts, train_bpe
    from tinygrad_ssm.train.data import stdlib_sources
    files = stdlib_sources()[:4] + [corpus]
    return train_bpe(corpus_texts(*files), tmp_path_factory.mktemp("tokenizer") / "tokenizer.json")
