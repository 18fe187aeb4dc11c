"""The HTTP frontend process: OpenAI-compatible API, SSE, /health, /metrics (FastAPI).

app.py             routes, auth, error handlers      serving.py         a request's flow
protocol.py        request models -> SamplingParams  responses.py       OpenAI response shapes
engine_client.py   ZeroMQ sockets + inbox dispatch   request_handle.py  a request's output queue,
cluster.py         who is in, who is up, what a dead                    timeout, disconnect watch
                   one held; replica choice          metrics.py         Prometheus
server.py          run(config): uvicorn              errors.py          OpenAI error JSON
api/               the other dialects over serving's chat path: anthropic*.py (/v1/messages),
                   openai_responses.py, responses_*.py, response_store.py (/v1/responses)
"""
