"""The parts of benchmarks/bench_serving.py, the serving load generator (its CLI and
importable entry points stay there):

    prompts.py   the request specs: --dataset random | fixed | jsonl, token counting
    schedule.py  submit times: all at once, Poisson/gamma arrivals, a fixed interval
    client.py    one OpenAI-compatible HTTP request, timed (TTFT, chunks, usage)
    runner.py    the run: warm-up, schedule, the result dict
    submit.py    one process's HTTP client and its requests sent on schedule under the limit
    workers.py   --client-processes: the measured requests sent from several processes
    stats.py     percentiles, latency figures, throughput, the tokens/s time series
    report.py    the printed table, the --plot PNG, strict-JSON values
"""
