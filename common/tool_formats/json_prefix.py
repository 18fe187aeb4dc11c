"""How much of a JSON text being written is still valid: the longest prefix some
continuation could complete into one JSON object. A stream of tool-call arguments sends
no further than that (frontend.tools.stream, a JsonPrefix a call, which scans what was
added since its last look only), so what a client has assembled always parses as partial
JSON, whatever the model wrote next.

    json_prefix_len('{"city": "Par')    -> 13  (all of it: a string being written)
    json_prefix_len('{"city": Paris}')  -> 9   (up to the bare word)
    json_prefix_len('{"a": 1}}')        -> 8   (the object is complete; a brace more is not)
"""

from __future__ import annotations

_WS = " \t\r\n"
_ESCAPES = '"\\/bfnrt'
_HEX = "0123456789abcdefABCDEF"
_LITERALS = {"t": "true", "f": "false", "n": "null"}

# what the scanner expects next, outside strings, numbers and literals
_VALUE, _VALUE_OR_CLOSE, _KEY_OR_CLOSE, _KEY, _COLON, _AFTER = range(6)
# inside a number: after "-", after a leading "0", integral digits, after ".", fraction
# digits, after "e", after the exponent's sign, exponent digits
_MINUS, _ZERO, _INT, _DOT, _FRAC, _E, _ESIGN, _EXP = range(8)
_NUMBER_ENDS = (_ZERO, _INT, _FRAC, _EXP)


def _number_step(state: int, ch: str) -> int | None:
    """The number's next state on `ch`, or None where the number cannot take it."""
    digit = "0" <= ch <= "9"
    if state == _MINUS:
        return _ZERO if ch == "0" else _INT if digit else None
    if state in (_ZERO, _INT) and ch == ".":
        return _DOT
    if state in (_ZERO, _INT, _FRAC) and ch in "eE":
        return _E
    if state == _INT and digit:
        return _INT
    if state in (_DOT, _FRAC) and digit:
        return _FRAC
    if state == _E and ch in "+-":
        return _ESIGN
    if state in (_E, _ESIGN, _EXP) and digit:
        return _EXP
    return None


class JsonPrefix:
    """json_prefix_len over a text that only grows (a call's arguments as a stream writes
    them): each `extend` scans only what was added since the last, from the saved state,
    so a long argument costs its length once, not once a token."""

    def __init__(self, object_only: bool = True) -> None:
        self.object_only = object_only
        self.stack: list[str] = []  # the open containers, "{" or "["
        self.state = _VALUE
        self.string: bool | None = None  # in a string: whether it is a key
        self.escape = 0  # in an escape: 1 after the backslash, 2-5 in \\uXXXX's digits
        self.number: int | None = None  # in a number: its state
        self.literal = ""  # in true/false/null: the letters still to come
        self.pos = 0  # the characters scanned
        self.valid: int | None = None  # where the text stopped being valid, once it did

    def extend(self, text: str) -> int:
        """The valid prefix's length of `text`, whose first `pos` characters are the
        ones scanned before (the caller's invariant: it only grows)."""
        if self.valid is not None:
            return self.valid
        at = self._scan(text)
        if at < len(text):
            self.valid = at
        self.pos = len(text)
        return at

    def _scan(self, text: str) -> int:
        stack, state, string = self.stack, self.state, self.string
        escape, number, literal = self.escape, self.number, self.literal
        try:
            for i in range(self.pos, len(text)):
                ch = text[i]
                if string is not None:
                    if escape == 1:
                        if ch not in _ESCAPES and ch != "u":
                            return i
                        escape = 2 if ch == "u" else 0
                    elif escape:
                        if ch not in _HEX:
                            return i
                        escape = 0 if escape == 5 else escape + 1
                    elif ch == "\\":
                        escape = 1
                    elif ch == '"':
                        state, string = (_COLON if string else _AFTER), None
                    elif ch < " ":
                        return i
                    continue
                if literal:
                    if ch != literal[0]:
                        return i
                    literal = literal[1:]
                    if not literal:
                        state = _AFTER
                    continue
                if number is not None:
                    step = _number_step(number, ch)
                    if step is not None:
                        number = step
                        continue
                    if number not in _NUMBER_ENDS:
                        return i
                    number, state = None, _AFTER  # the number ended: `ch` is read below
                if ch in _WS:
                    continue
                if state in (_VALUE, _VALUE_OR_CLOSE):
                    top = not stack
                    if state == _VALUE_OR_CLOSE and ch == "]":
                        stack.pop()
                        state = _AFTER
                    elif ch == "{":
                        stack.append("{")
                        state = _KEY_OR_CLOSE
                    elif self.object_only and top:
                        return i
                    elif ch == "[":
                        stack.append("[")
                        state = _VALUE_OR_CLOSE
                    elif ch == '"':
                        string = False
                    elif ch == "-" or "0" <= ch <= "9":
                        number = _MINUS if ch == "-" else _ZERO if ch == "0" else _INT
                    elif ch in _LITERALS:
                        literal = _LITERALS[ch][1:]
                    else:
                        return i
                elif state in (_KEY_OR_CLOSE, _KEY):
                    if ch == '"':
                        string = True
                    elif ch == "}" and state == _KEY_OR_CLOSE:
                        stack.pop()
                        state = _AFTER
                    else:
                        return i
                elif state == _COLON:
                    if ch != ":":
                        return i
                    state = _VALUE
                elif state == _AFTER and stack:
                    if ch == ",":
                        state = _KEY if stack[-1] == "{" else _VALUE
                    elif ch == ("}" if stack[-1] == "{" else "]"):
                        stack.pop()
                    else:
                        return i
                else:  # the value is complete: only whitespace may follow
                    return i
            return len(text)
        finally:
            self.stack, self.state, self.string = stack, state, string
            self.escape, self.number, self.literal = escape, number, literal


def json_prefix_len(text: str, object_only: bool = True) -> int:
    """The length of the longest prefix of `text` that some continuation makes one valid
    JSON value (an object, with `object_only`). Whitespace is free where JSON allows it."""
    return JsonPrefix(object_only).extend(text)
