"""Tool calling, one room for every dialect that offers tools (the OpenAI chat API here,
frontend/api/'s Anthropic and Responses surfaces over it):

request.py      a request's `tools` / `tool_choice` checked, and past tool calls in a
                chat history as templates take them
grammar.py      a required or named tool call forced by a grammar over the parser's format
parsers/        the formats a model writes its calls in (hermes, llama3_json, mistral,
                pythonic): full-text and streamed parsing
stream.py       a streamed reply split into text and tool-call deltas as it arrives
chat_format.py  the chat response format with tool calls (`ToolChatFormat`)
"""
