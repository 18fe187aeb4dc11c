"""The API dialects, each a room over the shared intake (frontend/intake.py) and engine
path (frontend/engine_path.py):

openai.py             /v1/completions, /v1/chat/completions, /generate, /v1/models; its
                      chat path (`chat_request`) is the other dialects' way in
openai_protocol.py    their request bodies     openai_sampling.py  -> SamplingParams
openai_format.py      chat and completions responses (openai_usage.py: their usage)
anthropic*.py         /v1/messages            openai_responses.py, responses_*.py,
                                              response_store.py: /v1/responses
"""
