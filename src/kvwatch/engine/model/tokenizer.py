"""Byte-level tokenizer and a chat template with turn markers.

Ids 0..255 are bytes; the special tokens follow. A chat renders as::

    <|bos|> <|system|> ...bytes... <|end|> <|user|> ...bytes... <|end|> <|assistant|>

and an assistant turn ends with ``<|end|>``, which is the model's stop token.
"""

from __future__ import annotations

import codecs
from collections.abc import Iterable, Mapping, Sequence
from typing import NamedTuple

BOS, EOS, SYSTEM, USER, ASSISTANT, TOOL, END, PAD = range(256, 264)
VOCAB_SIZE = 264
SPECIAL_NAMES = {
    BOS: "<|bos|>",
    EOS: "<|eos|>",
    SYSTEM: "<|system|>",
    USER: "<|user|>",
    ASSISTANT: "<|assistant|>",
    TOOL: "<|tool|>",
    END: "<|end|>",
    PAD: "<|pad|>",
}
ROLE_TOKENS = {"system": SYSTEM, "user": USER, "assistant": ASSISTANT, "tool": TOOL}
STOP_TOKENS = frozenset({EOS, END})
ROLES = frozenset(ROLE_TOKENS.values())


def last_turn_start(tokens: Sequence[int]) -> int | None:
    """Where the prompt's last message begins: its role marker's position.

    A trailing ``<|assistant|>`` generation prompt is not a message. Everything
    before the returned position is the conversation so far, which the next
    turn repeats; None when the prompt has no turn markers at all.
    """
    end = len(tokens) - 1 if tokens and tokens[-1] == ASSISTANT else len(tokens)
    for i in range(end - 1, -1, -1):
        if tokens[i] in ROLES:
            return i
    return None


class ByteTokenizer:
    vocab_size = VOCAB_SIZE

    def encode(self, text: str) -> list[int]:
        """UTF-8 bytes of ``text``; lone surrogates are rejected with ValueError."""
        try:
            return list(text.encode("utf-8"))
        except UnicodeEncodeError as exc:
            raise ValueError(f"text is not valid Unicode: {exc.reason} at {exc.start}") from None

    def decode(self, ids: Iterable[int], *, skip_special: bool = True) -> str:
        out, run = [], bytearray()
        for i in ids:
            if 0 <= i < 256:
                run.append(i)
                continue
            out.append(run.decode("utf-8", errors="replace"))
            run = bytearray()
            if not skip_special:
                out.append(SPECIAL_NAMES.get(i, f"<|{i}|>"))
        out.append(run.decode("utf-8", errors="replace"))
        return "".join(out)


class ChatMessage(NamedTuple):
    role: str
    content: str


class ChatTemplate:
    def __init__(self, tokenizer: ByteTokenizer | None = None) -> None:
        self.tokenizer = tokenizer or ByteTokenizer()

    def render(
        self,
        messages: Sequence[ChatMessage | Mapping[str, str]],
        *,
        add_generation_prompt: bool = True,
    ) -> list[int]:
        return [BOS, *self.render_turn(messages, add_generation_prompt=add_generation_prompt)]

    def continue_session(
        self, history: Sequence[int], messages: Sequence[ChatMessage | Mapping[str, str]]
    ) -> list[int]:
        """A session's next prompt: its tokens so far, then the new messages.

        An assistant turn cut short (no ``<|end|>``) is closed first, so every
        message starts on a turn marker. An empty history starts the chat.
        """
        if not history:
            return self.render(messages)
        close = [] if history[-1] in STOP_TOKENS else [END]
        return [*history, *close, *self.render_turn(messages)]

    def render_turn(
        self,
        messages: Sequence[ChatMessage | Mapping[str, str]],
        *,
        add_generation_prompt: bool = True,
    ) -> list[int]:
        """Messages with their turn markers, without the leading ``<|bos|>``."""
        ids: list[int] = []
        for m in messages:
            role, content = (
                (m.role, m.content) if isinstance(m, ChatMessage) else (m["role"], m["content"])
            )
            if role not in ROLE_TOKENS:
                raise ValueError(f"unknown role {role!r}; roles are {', '.join(ROLE_TOKENS)}")
            ids.append(ROLE_TOKENS[role])
            ids += self.tokenizer.encode(content)
            ids.append(END)
        if add_generation_prompt:
            ids.append(ASSISTANT)
        return ids


class TextStream:
    """Turns a stream of token ids into text deltas, holding back split UTF-8 bytes."""

    def __init__(self) -> None:
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def feed(self, ids: Iterable[int]) -> str:
        return self._decoder.decode(bytes(i for i in ids if 0 <= i < 256))

    def flush(self) -> str:
        return self._decoder.decode(b"", final=True)
