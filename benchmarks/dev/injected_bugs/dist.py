"""Bugs in data-parallel training and what surrounds a run (tinygrad_ssm/distributed.py and its use in train/loop.py,
diagnostics.py, the parts of io/ and train/ that app.py leaves: safetensors metadata, casts and strictness, a file
replaced after open, checkpoint lookup and pruning, the run lock, Ctrl-C/SIGTERM, the log): each should fail a test a
developer runs for its file. The MPI tests run under the venv's mpiexec -n 2 (mpi4py installed; they skip without).
Last full run: 57 of 57 caught, 5 min 9 s wall on the shared 2-core machine (an AMD EPYC, 2026-12-06, after
--grad-accum's bugs 55-57); the Ctrl-C bug alone can take ~90 s (rank 0 waits for rank 1 until the test's mpiexec
timeout). 34 caught again after safetensors.py's two-pass read moved its text (2026-12-06, late night).
58-60 (MPI failure modes, 2026-12-07; each hangs the job until its test's timeout) 3 of 3, 6 min 40 s.
"""
# ruff: noqa: E501 (each bug quotes lines of code whole, so that it names one place)
from inject_bugs import Bug

D = "tinygrad_ssm/distributed.py"
API = ("tests/test_distributed.py::test_python_api_in_ones_own_loop",)
FAKE = ("tests/train/test_fake_ranks.py",)
MPI_RUNS = ("tests/test_mpi_runs.py",)
TWO_EQUALS_ONE = ("tests/test_distributed.py::test_two_ranks_equal_one_process_fresh_resumed_and_with_another_world_size",)
ROWS = ("tests/test_distributed.py::test_each_rank_trains_on_its_own_share_of_the_global_batch",)
GRAD = ("tests/test_gradient_report.py",)
MICRO = ("tests/test_distributed.py::test_micro_batches_on_two_ranks_equal_one_process_and_send_once",)
IO = ("tests/io",)
ST = "tinygrad_ssm/io/safetensors.py"
LOOP = "tinygrad_ssm/train/loop.py"
STEP = "tinygrad_ssm/train/step.py"

BUGS = [
    # --- distributed.py: the gradient averaging -------------------------------------------------------------------
    Bug(D, "values = bucket.buffer[:bucket.n_values] / self.world.size", "values = bucket.buffer[:bucket.n_values]",
        API, "the allreduced gradients are summed over the ranks, not averaged"),
    Bug(D, "while self._next < len(self.buckets) and self.buckets[self._next].pending == 0:",
        "while self._next < len(self.buckets) and self.buckets[self._next].pending <= 1:",
        API, "a bucket's allreduce starts before its last gradient is in it"),
    Bug(D, "        self._next, self._seen = 0, {}\n", "        self._next = 0\n",
        API, "finish() forgets to reset which gradients were sent: the next step's backward looks like a second one"),
    Bug(D, "            bucket.pending, bucket.request = len(bucket.named), None", "            bucket.request = None",
        API, "the buckets' pending counts not reset after finish(): the next step sends them before backward fills them"),
    Bug(D, "                has_grad = bucket.buffer[bucket.n_values + i] > 0", "                has_grad = True",
        API, "a parameter no rank has a gradient for gets a zero gradient instead of None"),
    Bug(D, "            self.buffer[lo:hi] = 0\n            self.buffer[self.n_values + i] = 0", "            self.buffer[self.n_values + i] = 0",
        API, "a rank without a gradient for a parameter sends its stale values of the last step"),
    Bug(D, "            if current and (p.dtype != current[0][1].dtype or\n", "            if current and (False or\n",
        API, "parameters of different dtypes share a bucket (a float32 gradient comes back in the bucket's float64)"),
    Bug(D, "                    if p.grad is not sent or (sent is not None and sent._version[0] != version):",
        "                    if p.grad is not sent:",
        API, "a .grad changed in place by a tensor op between backward() and finish() is dropped in silence"),
    # --- distributed.py: launchers, the world, the ranks compared --------------------------------------------------
    Bug(D, '_WORLD_SIZE_VARS = ("PMI_SIZE", "OMPI_COMM_WORLD_SIZE", "MV2_COMM_WORLD_SIZE")',
        '_WORLD_SIZE_VARS = ("PMI_SIZE", "MV2_COMM_WORLD_SIZE")',
        ("tests/test_distributed.py::test_each_launchers_variables_are_read",), "an Open MPI launch (OMPI_COMM_WORLD_SIZE) is not seen"),
    Bug(D, "    for var in _RANK_VARS:\n", "    for var in _WORLD_SIZE_VARS:\n",
        ("tests/test_distributed.py::test_each_launchers_variables_are_read", "tests/test_mpi_bad_flags.py"),
        "launcher_rank reads the world size's variable"),
    Bug(D, "    if launched > 1 and comm.Get_size() == 1:", "    if launched > 2 and comm.Get_size() == 1:",
        ("tests/test_distributed.py::test_a_launcher_size_that_mpi_does_not_see_is_refused",),
        "PMI_SIZE=2 left over while MPI sees one process is accepted (two lone copies train into one folder)"),
    Bug(D, "    launched = launcher_world_size()\n    if launched > 1:\n", "    launched = launcher_world_size()\n    if launched > 2:\n",
        ("tests/test_mpi_runs.py::test_rank_and_world_size_before_init_under_a_launcher_raise",),
        "rank() before init() under mpiexec -n 2 says 0 of 1"),
    Bug(D, "    if world.size == 1:\n        return\n\n    mine = weight_checksums(params)", "    if world.size <= 2:\n        return\n\n    mine = weight_checksums(params)",
        FAKE, "the ranks' weights never compared in a two-rank job"),
    Bug(D, "    return np.array([zlib.crc32(np.ascontiguousarray(p.data).tobytes())",
        "    return np.array([zlib.crc32(np.ascontiguousarray(p.data).reshape(-1)[:1].tobytes())",
        FAKE, "the weight checksum covers only each parameter's first element"),
    Bug(D, "        ranks = [r for r in range(world.size) if differ[r].any()]", "        ranks = [r for r in range(1, world.size) if differ[r - 1].any()]",
        FAKE, "RanksDiverged names the wrong rank"),
    Bug(D, "    for group in sorted(optimizers):\n        state = world.broadcast_arrays(", "    for group in sorted(optimizers)[:0]:\n        state = world.broadcast_arrays(",
        ("tests/test_mpi_runs.py::test_a_tokenized_run_resumes_on_two_ranks_without_the_tokenizer_file",),
        "a resumed 2-rank run: rank 1 keeps fresh optimizer moments (rank 0's never sent)"),
    Bug(D, "                                                error.errno if isinstance(error, OSError) else None,",
        "                                                None,",
        FAKE, "rank 0's failed save reaches the other ranks without its errno"),
    # --- loop.py under MPI ----------------------------------------------------------------------------------------
    Bug(LOOP, "            if i % world.size == world.rank:", "            if i % world.size == 0:",
        TWO_EQUALS_ONE, "every rank evaluates the same validation batches (the others skipped): val_bpb of the first half"),
    Bug(STEP, "        run.loss_val, run.stop_signals = sums[0] / run.world.size,", "        run.loss_val, run.stop_signals = sums[0],",
        TWO_EQUALS_ONE, "the logged loss is the sum over the ranks, not their mean"),
    Bug(STEP, "    n_tokens = x.size * run.world.size", "    n_tokens = x.size",
        TWO_EQUALS_ONE, "tokens seen counts one rank's share of the batch"),
    Bug(LOOP, "    if run.world.is_root:\n        run.log.append(record)", "    if True:\n        run.log.append(record)",
        TWO_EQUALS_ONE, "every rank appends its step record to the run's log"),
    Bug(STEP, "    rows = slice(run.world.rank * len(x) // run.world.size, (run.world.rank + 1) * len(x) // run.world.size)",
        "    rows = slice(run.world.rank * len(x) // run.world.size, (run.world.rank + 1) * len(x) // run.world.size + 1)",
        ROWS, "the ranks' shares of the global batch overlap by a row"),
    Bug(STEP, "        run.stop_requested = bool(run.stop_signals)", "        run.stop_requested = bool(stop_signal)",
        ("tests/test_mpi_runs.py::test_ctrl_c_on_rank_1_is_said_by_rank_0_and_a_second_one_after_the_stop_ends_the_job",),
        "a Ctrl-C on rank 1 stops rank 1 alone"),
    Bug(LOOP, "        _check_ranks_agree(self)\n        self.last_ckpt, self.saved_step", "        self.last_ckpt, self.saved_step",
        ("tests/test_mpi_runs.py", "-k", "before_every_save"), "a checkpoint saved without comparing the ranks' weights"),
    # --- diagnostics.py ------------------------------------------------------------------------------------------
    Bug("tinygrad_ssm/diagnostics.py", "        elif not np.all(np.isfinite(grad.data)):", "        elif np.isnan(grad.data).any():",
        GRAD, "an infinite gradient is not flagged as non-finite"),
    Bug("tinygrad_ssm/diagnostics.py", "            if isinstance(parent, Tensor) and parent.requires_grad and id(parent) not in seen:",
        "            if isinstance(parent, Tensor) and id(parent) not in seen:", GRAD, "plain inputs reported as stray tensors"),
    Bug("tinygrad_ssm/diagnostics.py", "rows.append(ParamRow(name, tuple(t.shape), status, norm, id(t) in leaves))",
        "rows.append(ParamRow(name, tuple(t.shape), status, norm, True))",
        GRAD, "a parameter cut off by a detach() is said to reach the loss (backward not called?)"),
    Bug("tinygrad_ssm/diagnostics.py", "        return self.loss_requires_grad and not self.strays and", "        return not self.strays and",
        GRAD, "a loss computed under no_grad reports OK"),
    Bug("tinygrad_ssm/diagnostics.py", "norm = None if grad is None else float(np.sqrt(np.sum(np.square(grad.data, dtype=np.float64))))",
        "norm = None if grad is None else float(np.sum(np.square(grad.data, dtype=np.float64)))",
        GRAD, "the reported gradient norm is the squared norm"),
    Bug("tinygrad_ssm/diagnostics.py", "        ops.append(op)\n", "        ops.insert(0, op)\n",
        GRAD, "a stray's path to the loss printed backwards"),
    # --- io/safetensors.py: metadata, casts, strictness, a replaced file ---------------------------------------
    Bug(ST, "    if not isinstance(metadata, dict) or not all(isinstance(k, str) and isinstance(v, str)",
        "    if not isinstance(metadata, dict) or not all(isinstance(k, str)", IO, "metadata values that are not strings accepted"),
    Bug(ST, "    if isinstance(metadata, _Duplicated):\n", "    if False:\n", IO, "__metadata__ naming a key twice accepted"),
    Bug(ST, "    made = ~np.isfinite(converted) & np.isfinite(stored)", "    made = ~np.isfinite(converted)",
        IO, "a stored infinity refused as if the cast had overflowed"),
    Bug(ST, "            f, offset = self._file, self._data_start", "            f, offset = open(self.path, \"rb\", buffering=0), self._data_start",
        IO, "a read reopens the path: a file replaced after it was opened is read in its place"),
    Bug(ST, "        if not info.shape or not 0 <= start <= stop <= info.shape[0]:", "        if not info.shape or not 0 <= start <= stop <= info.shape[0] + 1:",
        IO, "read_rows accepts a stop one past the last row"),
    Bug(ST, "        if t.begin < at:\n", "        if t.begin < at - 4:\n", IO, "tensors that overlap by a few bytes accepted"),
    # --- io/checkpoints.py, train/checkpoint.py (pruning) -------------------------------------------------------
    Bug("tinygrad_ssm/io/checkpoints.py", "        if (p / CHECKPOINTS_DIR / name / STATE_FILE).is_file():", "        if (p / CHECKPOINTS_DIR / name).is_dir():",
        ("tests/train/test_run_folder.py",), "LATEST naming a folder without trainer_state.json is resumed from"),
    Bug("tinygrad_ssm/train/checkpoint.py", "    for p, state in ours[:-keep]:", "    for p, state in ours[:-keep - 1]:",
        ("tests/train/test_ownership.py", "-k", "pruning"), "pruning keeps keep + 1 checkpoints"),
    Bug("tinygrad_ssm/train/checkpoint.py", "    return sorted(ours, key=lambda item: step_of(item[0].name))",
        "    return sorted(ours, key=lambda item: item[0].name)",
        ("tests/train/test_ownership.py", "-k", "pruning"), "pruning orders step-1000000 before step-999999 (by name, not number)"),
    # --- train/sigint.py, run_folder.py (the lock), log.py -------------------------------------------------------
    Bug("tinygrad_ssm/train/sigint.py", "STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)", "STOP_SIGNALS = (signal.SIGINT,)",
        ("tests/train/test_train.py", "-k", "sigterm"), "SIGTERM kills the run without a checkpoint"),
    Bug("tinygrad_ssm/train/sigint.py", "        if self.requested:\n            raise self._interrupt(signum)", "        if False:\n            raise self._interrupt(signum)",
        ("tests/train/test_train.py", "-k", "sigterm or ctrl_c or keyboard"), "a second Ctrl-C never stops at once"),
    Bug("tinygrad_ssm/train/sigint.py", "            signal.signal(s, previous)\n", "            pass\n",
        ("tests/train/test_train.py", "-k", "sigterm or ctrl_c or keyboard"), "the handlers before training not put back at its end"),
    Bug("tinygrad_ssm/train/sigint.py", "            self.said = True\n", "",
        ("tests/train/test_train.py", "-k", "ctrl_c"), "a Ctrl-C during the last save said again at every further Ctrl-C"),
    Bug("tinygrad_ssm/train/run_folder.py", "            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)", "            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)",
        ("tests/train/test_run_folder.py", "tests/train/test_ownership.py"), "the run lock is shared: two trainings may hold it at once"),
    Bug("tinygrad_ssm/train/run_folder.py", "    if not stat.S_ISREG(st.st_mode) or st.st_nlink != 1:", "    if not stat.S_ISREG(st.st_mode):",
        ("tests/train/test_run_folder.py", "tests/train/test_ownership.py"), "a run.lock hard-linked to a user's file is truncated and written"),
    Bug("tinygrad_ssm/train/log.py", "                if number == len(lines):  # the torn tail", "                if number >= len(lines) - 1:  # the torn tail",
        ("tests/train/test_run_folder.py", "-k", "log"), "a broken log line before the last one passed over in silence"),
    Bug("tinygrad_ssm/train/log.py", "        kept = [r for r in self.records() if r[\"step\"] <= step]", "        kept = [r for r in self.records() if r[\"step\"] < step]",
        ("tests/train/test_train.py", "-k", "resume"), "a resume drops the log records of the checkpoint's own step"),
    # --- added in a second pass -----------------------------------------------------------------------------------
    Bug(D, "                error = (FileExistsError(message) if exists else OSError(number, text, filename)",
        "                error = (OSError(number, text, filename)", FAKE,
        "rank 0's FileExistsError reaches the other ranks as a plain OSError"),
    Bug(D, "        self.last_launched_early = self._next  # buckets", "        self.last_launched_early = 0  # buckets",
        TWO_EQUALS_ONE, "the log says no bucket was sent during the backward"),
    Bug(D, "            p.data[...] = weights[name]\n", "            pass\n",
        ("tests/test_mpi_runs.py::test_a_tokenized_run_resumes_on_two_ranks_without_the_tokenizer_file",),
        "rank 0's weights, loaded from a checkpoint, never written into the other ranks' parameters"),
    Bug(LOOP, "    total, count = (float(v) for v in world.sum([total, count]))", "    total, count = float(total), float(count)",
        TWO_EQUALS_ONE, "each rank's validation loss is its own share's (never summed over the ranks)"),
    Bug(LOOP, "    say = (say or (lambda m: tqdm.write(m, file=sys.stdout))) if world.is_root else (lambda m: None)",
        "    say = say or (lambda m: tqdm.write(m, file=sys.stdout))",
        TWO_EQUALS_ONE, "every rank prints the run's messages"),
    Bug(ST, "    metadata = {} if metadata is None else metadata\n", "", IO, "a null __metadata__ refused (the library reads it as none)"),
    Bug("tinygrad_ssm/train/log.py", "        keep_mode_of(fd, path)\n        with os.fdopen(fd, \"wb\") as f:\n            fig.savefig",
        "        with os.fdopen(fd, \"wb\") as f:\n            fig.savefig",
        ("tests/io/test_file_modes.py",), "a replaced loss plot loses its permission bits"),
    # --- --grad-accum under MPI: the micro-batches' backwards before the last hold their gradients back ---------
    Bug(D, "        self._held = True\n", "        self._held = False\n", MICRO,
        "no_sync() holds nothing back: the second micro-batch's backward raises"),
    Bug(STEP, "    return reducer.no_sync() if reducer is not None else contextlib.nullcontext()",
        "    return contextlib.nullcontext()", MICRO, "the training step accumulates without no_sync() under MPI"),
    Bug(LOOP, "    if share % cfg.grad_accum:", "    if False:", MICRO,
        "a rank's share the micro-batches cannot split: unequal micro-batches weighted as equal"),
    # --- MPI failure modes (found by an audit, 2026-12-07) -------------------------------------------------------------
    Bug('tinygrad_ssm/train/loop.py', '    return corpus, fingerprint\n\n\ndef _same_corpus_as_root', '    _same_corpus_as_root(corpus, fingerprint, world)\n    return corpus, fingerprint\n\n\ndef _same_corpus_as_root',
        ('tests/test_mpi_runs.py', '-k', 'inner_rank'), "the corpus check's broadcast inside the agreed data loading: an inner rank's failure hangs 4 ranks"),
    Bug('tinygrad_ssm/train/loop.py', "    try:  # from here on one rank's error ends the whole job (below): an import failing on one rank left all waiting\n        from tqdm import tqdm\n", "    from tqdm import tqdm\n    try:  # from here on one rank's error ends the whole job (below): an import failing on one rank left all waiting\n",
        ('tests/test_mpi_runs.py', '-k', 'import_failing'), "an import failing on one rank at train()'s start hangs the job"),
    Bug('tinygrad_ssm/distributed.py', '        self._check_same_buckets()\n', '',
        ('tests/test_mpi_runs.py', '-k', 'buckets'), 'ranks cutting other gradient buckets sum unrelated numbers (a false divergence, then a hang)'),
    Bug(STEP, "        run.loss_val, run.stop_signals = sums[0] / run.world.size, {r: int(s) for r, s in enumerate(sums[1:]) if s}",
        "        run.loss_val, run.stop_signals = sums[0] / run.world.size, {r: 2 for r, s in enumerate(sums[1:]) if s}",
        ("tests/test_mpi_runs.py", "-k", "sigterm"), "rank 0 says Ctrl-C for a SIGTERM on another rank"),
    Bug(LOOP, "            if isinstance(e, OSError):  # a file of this rank's own", "            if False:  # a file of this rank's own",
        ("tests/test_mpi_runs.py", "-k", "log_failing"), "rank 0's log failing under MPI ends the job with exit 1 and a traceback"),
    Bug("tinygrad_ssm/distributed.py", "        os._exit(code)   # MPICH's Abort may return", "        pass   # MPICH's Abort may return",
        ("tests/test_mpi_runs.py", "-k", "log_failing"), "an Abort that returns goes on: a second message with a traceback"),
    Bug("tinygrad_ssm/train/log.py", "            raise OSError(e.errno, e.strerror, str(self.path)) from e", "            raise",
        ("tests/test_mpi_runs.py", "-k", "log_failing"), "a failed append to log.jsonl names no file"),
]
