"""Tool calling in the frontend, one room for every dialect that offers tools (the OpenAI
chat API, frontend/api/'s Anthropic and Responses surfaces over it). The formats a model
writes its calls in (their prompt, parser and grammar) are common/tool_formats/.

request.py      a request's `tools` / `tool_choice` checked, past tool calls in a chat
                history as templates take them, and what tools change in SamplingParams
                (special tokens kept, a forced call's grammar)
stream.py       a streamed reply split into text and tool-call deltas as it arrives
chat_format.py  the chat response format with tool calls (`ToolChatFormat`)
"""
