"""The parts of benchmarks/compare.py, a row or a concern per module (its CLI, the
docstring that describes the rows, and `main` stay there):

    workload.py     the prompts every row sees, as text and token ids
    runner.py       every row in turn, a failed row kept as its error, the result dict
    row_offline.py  (a) LLMEngine in process; the paired in-process prefill
    row_server.py   (b, c) launch.py as a subprocess, one per --workers-list entry
    row_hf.py       (d) transformers generate
    row_llama.py    (e) llama.cpp's llama-server
    server_runs.py  bench_serving's loads against a running server (rows b, c, e)
    process.py      a server subprocess: start, /health, /metrics, idle, stop
    metrics.py      Prometheus text, the scheduler's busy split and counter deltas
    engine_args.py  the engine flags shared by the servers and the offline engine
    checks.py       the three targets: PASS / FAIL / SKIP
    table.py        the printed table
    util.py         log, median, mean

and of benchmarks/compare_files.py (zeroserve vs llama-server per GGUF file):

    per_file.py        one file: both servers, one after the other, on the same prompts
    zeroserve_proc.py  launch.py as a subprocess, its start-up and scheduler memory
    gguf_types.py      a file's tensor types, bytes and roles (gguf-py)
    file_table.py      the per-file blocks and issue 21's table
"""
