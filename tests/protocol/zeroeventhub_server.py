"""A v1 feed served by the `zeroeventhub` package's own FastAPI handler.

Runs in a separate virtualenv (zeroeventhub pins old fastapi/starlette), started by the test:
    python zeroeventhub_server.py PORT PARTITIONS EVENTS_PER_PARTITION
Partition p holds events {"id": "p-i", "n": i, "text": ...}; the cursor after event i is str(i + 1).
"""

import sys

import uvicorn
from fastapi import FastAPI, Request
from zeroeventhub import ZeroEventHubFastApiHandler

PORT, PARTITIONS, EVENTS = (int(a) for a in sys.argv[1:4])


def payload(partition, i):
    return {"id": f"{partition}-{i}", "n": i, "text": 'Grüße "zeh" \\ 日本'}


class Reader:
    def get_data(self, cursors, headers, page_size):
        for cursor in cursors:
            start = 0 if cursor.cursor == "_first" else int(cursor.cursor)
            stop = min(EVENTS, start + (page_size or 100))
            for i in range(start, stop):
                yield {"partition": cursor.partition_id, "data": payload(cursor.partition_id, i)}
                if i % 3 == 2 or i == stop - 1:
                    yield {"partition": cursor.partition_id, "cursor": str(i + 1)}
            if start >= stop:
                yield {"partition": cursor.partition_id, "cursor": str(start)}


app = FastAPI()
handler = ZeroEventHubFastApiHandler(data_reader=Reader(), server_partition_count=PARTITIONS)


@app.get("/feed")
def feed(request: Request):
    return handler.handle(request)


if __name__ == "__main__":
    uvicorn.run(app, host="127.0.0.1", port=PORT, log_level="warning")
