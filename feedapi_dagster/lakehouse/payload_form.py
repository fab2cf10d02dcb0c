"""The payload's form in a feed's table (the feed's `payload_form` setting): `json`, the event as its JSON
text only (`payload STRING`); `variant`, beside that text a column `data VARIANT` holding the payload
parsed (Spark 4 / Delta 4's VARIANT), so that a query reads fields by path (`data:amount::int`) without
a `from_json` schema; or `columns`, beside that text the payload's top-level keys as typed columns and
what does not fit them in `_rescued_data` (`typed_columns.py`, planned by `planning.payload_columns`).

`payload` stays in both forms: it is the exact bytes the feed sent, what the project's own machinery
reads (event ids, deduplication, the checks), and what an analyst falls back on. `data` is derived from
it by Spark in the one write path (`FeedTable.write`), in the same job and the same Delta commit as the
rows and the cursor of record: a batch load's commit and a stream's micro-batch both pass there. A
columns table's typed columns come from the same parse (`data` is not stored there).

What `data` holds, row by row (`docs/configuration/payload-form.md`):
* an object, array, number, boolean: the payload parsed (`try_parse_json(payload)`);
* a JSON string payload, which `payload` holds decoded (`read/rows.py`): that string as a variant
  string (the text is encoded back to JSON and parsed: `payload` alone no longer says it was a string);
* JSON `null`: a variant null (`data IS NULL` is false, `is_variant_null(data)` true);
* a payload Spark's parser refuses (an unpaired surrogate escape `"\\ud800"`, a key twice in one
  object unless the session sets `spark.sql.variant.allowDuplicateKeys`, nesting deeper than Spark
  takes): SQL NULL. The row is loaded all the same, its text in `payload`: a load
  never fails or drops an event over its variant. `data IS NULL` finds exactly these rows.

So that no such row goes unnoticed, the write job counts them per partition (`FormCounts`: Spark's
`observe`, in the same job, no second pass), and for a columns table the rows with rescued values too:
the load's report, its materializations (`unparsed_payloads`, `rescued_values`), a warning in the run
and the `payloads_parsed` check say how many it committed.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Literal

from feedapi_dagster.errors import LoadError, PayloadFormMismatch
from feedapi_dagster.lakehouse.feed_read import observed
from feedapi_dagster.planning.payload_columns import RESCUE_COLUMN
from feedapi_dagster.read.rows import PARTITION_COLUMN

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame

PayloadForm = Literal["json", "variant", "columns"]
DEFAULT_PAYLOAD_FORM: PayloadForm = "json"
DATA_COLUMN = "data"
# the columns a form adds to the table's (`read.rows.TABLE_SCHEMA`), after them, as Spark DDL
FORM_COLUMNS_DDL: dict[PayloadForm, str] = {
    "json": "",
    "variant": f"{DATA_COLUMN} VARIANT",
    "columns": f"{RESCUE_COLUMN} STRING",  # the typed columns come with the rows that bring them
}

# A string payload is held decoded: encoded back to a JSON string (inside an object, as `to_json` takes
# no bare string) and taken out as a variant. `try_` everywhere: no payload can fail the write.
DATA_SQL = (
    "CASE WHEN payload_type = 'string' "
    "THEN variant_get(try_parse_json(to_json(named_struct('s', payload))), '$.s', 'variant') "
    "ELSE try_parse_json(payload) END"
)


def data_column() -> Column:
    """The `data` column of rows that have `payload` and `payload_type` (a Spark expression)."""
    from pyspark.sql import functions as F

    return F.expr(DATA_SQL)


# a row whose payload Spark could not parse (a JSON `null` payload is a variant null, not SQL NULL)
UNPARSED_SQL = f"{DATA_COLUMN} IS NULL AND payload IS NOT NULL"
_UNPARSED = "unparsed"
_RESCUED = "rescued"


class UnparsedCountMissing(LoadError):
    """Spark committed a variant or columns write's rows but did not report how many of them it could not
    parse (or rescued values of)."""


class FormCounts:
    """How many rows of one Spark write job (of a variant or columns table's rows) have `data` SQL NULL
    and a `payload` (`UNPARSED_SQL`), and (a columns table's) a `_rescued_data`, per partition: `observe`
    it into the job's frame, ask `unparsed()` and `rescued()` once the job is over.

    Spark's `observe`, as the read ends (`feed_read.py`): observed metrics are accumulators merged only
    from the task attempts whose output Spark keeps, so the counts are of exactly the rows Delta
    committed, counted as they are written, without a second pass over them. Per partition in one
    aggregate: `histogram_numeric` of the rows' partition ids (NULL, so not counted, for a parsed row),
    which counts exactly while the distinct ids are at most its bins (it merges bins only beyond them,
    and equal ids' bins first): the bins are the partitions the write holds. A merged bin's id is the
    mean of the two, computed in floating point: the ids go in as doubles and are rounded back (given
    as integers, Spark truncates 2.9999999999 to 2: measured, a count landed on the wrong partition).
    Its state is at most a bin per partition, whatever the number of rows (a `collect_list` of their
    ids would grow with them: a producer that drifts wholly, a list of millions)."""

    def __init__(self, partitions: int):
        """`partitions`: how many partitions the rows may hold (at least)."""
        from pyspark.sql import Observation

        # a name of its own, as the read ends' (`FeedRead.frame`)
        self._observation = Observation(f"feedapi_form_counts_{uuid.uuid4().hex}")
        self._bins = max(2, partitions)  # Spark takes no fewer
        self._metrics: dict[str, Any] | None = None

    def observe(self, frame: DataFrame, *, rescued: bool = False) -> DataFrame:
        """`frame` (rows with `data`; `rescued`: and `_rescued_data`), its unparsed rows (and those with
        rescued values) counted by the job that writes it."""
        from pyspark.sql import functions as F

        counted = [F.expr(self._histogram(UNPARSED_SQL)).alias(_UNPARSED)]
        if rescued:
            counted.append(F.expr(self._histogram(f"{RESCUE_COLUMN} IS NOT NULL")).alias(_RESCUED))
        return frame.observe(self._observation, *counted)

    def _histogram(self, condition: str) -> str:
        return f"histogram_numeric(CASE WHEN {condition} THEN CAST({PARTITION_COLUMN} AS DOUBLE) END, {self._bins})"

    def unparsed(self) -> dict[int, int]:
        """The partitions with unparsed rows, and how many each (once the job is over);
        `UnparsedCountMissing` where Spark did not report them."""
        return self._counts(_UNPARSED)

    def rescued(self) -> dict[int, int]:
        """The partitions with rows with rescued values, and how many each (a columns table's write)."""
        return self._counts(_RESCUED)

    def _counts(self, name: str) -> dict[int, int]:
        if self._metrics is None:
            self._metrics = observed(self._observation, "count of unparsed payloads", UnparsedCountMissing)
        bins: list[Any] | None = self._metrics.get(name)
        counts: dict[int, int] = {}
        for mean_id, rows in bins or ():  # equal ids' bins may stay apart within the bins' number
            counts[round(mean_id)] = counts.get(round(mean_id), 0) + round(rows)
        return counts


def form_of(column_types: Mapping[str, str]) -> PayloadForm:
    """A table's form from its columns' type names (Spark's `simpleString`, delta-rs's `type`: both
    `variant` for a VARIANT column)."""
    if RESCUE_COLUMN in column_types:
        return "columns"
    return "variant" if column_types.get(DATA_COLUMN) == "variant" else "json"


def form_mismatch(path: str, found: PayloadForm, wanted: PayloadForm) -> PayloadFormMismatch:
    """A table whose form the feed's setting cannot be brought to in place: refused (`FeedTable.ensure_form`
    says why)."""
    has = {
        "variant": f"the payload's variant column `{DATA_COLUMN}`",
        "columns": f"typed payload columns and `{RESCUE_COLUMN}`",
    }.get(found, found)
    return PayloadFormMismatch(
        f"the Delta table {path} has {has} and the feed's payload_form is {wanted}: a load would leave what "
        f"{found} keeps empty in its rows, which queries of the table would take for payloads that had nothing "
        f"to say. Set `payload_form: {found}` to go on loading this table (its `payload` column is the JSON text "
        "in every form), or load the feed into a new table"
    )
