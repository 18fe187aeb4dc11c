"""The HTTP frontend process: OpenAI-compatible API, SSE, /health, /metrics (FastAPI).

app.py             routes, auth, error handlers      intake.py          a request's body read,
engine_path.py     the flow every dialect shares:                       parsed, its model checked
                   requests, replica, submit, SSE    request_handle.py  a request's output queue,
metrics.py         Prometheus (metric_table.py)                         timeout, disconnect watch
server.py          run(config): uvicorn              errors.py          OpenAI error JSON
frontends.py       several frontends on one port (--api-servers): the port, what they share
chat_history.py    chat messages as templates take them
cluster/           the cluster table (who is in, who is up, what a dead one held), replica
                   routing, /health, the sockets and EngineClient (submit, inbox dispatch)
tools/             tool calling: request checks, streamed calls (the formats:
                   common/tool_formats/)
api/               the dialects: openai*.py (completions, chat, /generate),
                   anthropic*.py (/v1/messages), openai_responses.py, responses_*.py,
                   response_store.py (/v1/responses)
"""
