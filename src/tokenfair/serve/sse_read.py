"""Reading a server-sent event stream of OpenAI chunks: each ``data:`` line's JSON object, in
order, until ``data: [DONE]``; other lines and data that is not JSON are skipped."""

from __future__ import annotations

import json
from typing import AsyncIterator

DONE = "[DONE]"


async def data_chunks(lines: AsyncIterator[str]) -> AsyncIterator[dict]:
    async for line in lines:
        if not line.startswith("data:"):
            continue
        data = line[5:].strip()
        if data == DONE:
            return
        try:
            chunk = json.loads(data)
        except ValueError:
            continue
        if isinstance(chunk, dict):
            yield chunk
