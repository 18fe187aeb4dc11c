"""The HTTP frontend process: OpenAI-compatible API, SSE, /health, /metrics (FastAPI).

app.py             routes, auth, error handlers      serving.py         a request's flow
protocol.py        request models -> SamplingParams  responses.py       OpenAI response shapes
engine_client.py   ZeroMQ sockets + inbox dispatch   request_handle.py  a request's output queue,
health.py          who is up; failing what a dead                       timeout, disconnect watch
                   component held                    metrics.py         Prometheus
server.py          run(config): uvicorn              errors.py          OpenAI error JSON
"""
