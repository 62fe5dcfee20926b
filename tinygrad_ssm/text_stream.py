"""Generated ids in, finished text out: `TextStream`.

    stream = TextStream(tok, prompt_ids)                 # tok: tokenizer.py's ByteTokenizer or FileTokenizer
    text = "".join(stream.push(i) for i in new_ids) + stream.finish()

A generated token need not end on a character boundary (a byte model emits one byte of a three-byte
character at a time; a byte-level BPE token may hold half of an emoji). TextStream therefore prints text only
once it decodes without a trailing U+FFFD, so a stream never shows half a character; what is still invalid
at the end comes out as U+FFFD, never as an exception. A byte-fallback tokenizer (Llama's <0xE2> tokens) decodes
a whole run of byte tokens at once, as U+FFFD for each of them when the run is not valid UTF-8, so a later byte
can change the text of earlier ones: TextStream holds a run back until a token that is not a byte ends it, and
prints only text that the decode of everything so far starts with. Joined, a stream is the decode of all ids.
"""
from __future__ import annotations

STREAM_CONTEXT = 4  # ids before the new ones that TextStream decodes with them (a decoder may look back)


def _stream_context(tokenizer, ids: list) -> list:
    """The end of `ids` that TextStream decodes with the new ids: the last STREAM_CONTEXT ids with text (special
    tokens, which decode skips, aside: Llama's Strip and a Metaspace decoder drop the space of the first token with
    text, which a context of special tokens alone would make the first new one), and back to the start of the
    byte-fallback run they end in (the ByteFallback decoder decodes a run whole; cut, it is invalid, U+FFFD for each
    byte, where the whole run with the new bytes may be text)."""
    byte_ids = getattr(tokenizer, "byte_fallback_ids", ())
    skipped = getattr(tokenizer, "skipped_ids", ())
    start, with_text = len(ids), 0
    while start > 0 and with_text < STREAM_CONTEXT:
        start -= 1
        with_text += ids[start] not in skipped
    if next((i for i in ids[start:] if i not in skipped), None) in byte_ids:        # inside a run: back to its start
        while start > 0 and (ids[start - 1] in byte_ids or ids[start - 1] in skipped):
            start -= 1
    return ids[start:]


class TextStream:
    """Generated ids in, finished text out (see the module docstring). `context`: the ids before the first
    pushed one (the prompt), decoded with the new ones so that a decoder that looks back (a space before a
    word) gives the text it would give for the whole sequence."""

    def __init__(self, tokenizer, context=()):
        self.tokenizer = tokenizer
        self.ids = _stream_context(tokenizer, [int(i) for i in context])  # the text already out, then pending ids
        self.printed = len(self.ids)                                       # ids[:printed] are out

    def push(self, token_id) -> str:
        self.ids.append(int(token_id))
        return self._flush(final=False)

    def finish(self) -> str:
        """What is still held back (an unfinished character comes out as U+FFFD)."""
        return self._flush(final=True)

    def _flush(self, final: bool) -> str:
        before = self.tokenizer.decode(self.ids[:self.printed])
        text = self.tokenizer.decode(self.ids)                           # the same with the pending ids
        if not text.startswith(before):  # the new ids changed text already out: only where they continue a
            text = before + self.tokenizer.decode(self.ids[self.printed:])  # prompt's byte run, made invalid
        if not final and (len(text) <= len(before) or text.endswith("\ufffd") or self._in_byte_run()):
            return ""                            # nothing new, half a character, or a byte run that may change
        del self.ids[:self.printed]                                      # the newly printed ids: the next context
        self.printed = len(self.ids)
        return text[len(before):]

    def _in_byte_run(self) -> bool:
        """Whether the pending ids end in a byte-fallback token (special tokens, which decode skips, aside): the
        next one may extend the run, and an invalid run decodes as U+FFFD for each of its bytes."""
        byte_ids = getattr(self.tokenizer, "byte_fallback_ids", ())
        if not byte_ids:
            return False
        skipped = getattr(self.tokenizer, "skipped_ids", ())
        for i in reversed(self.ids[self.printed:]):
            if i not in skipped:
                return i in byte_ids
        return False
