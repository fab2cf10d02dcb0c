"""The payload's form in a feed's table (the feed's `payload_form` setting): `json`, the event as its JSON
text only (`payload STRING`); or `variant`, beside that text a column `data VARIANT` holding the payload
parsed (Spark 4 / Delta 4's VARIANT), so that a query reads fields by path (`data:amount::int`) without
a `from_json` schema.

`payload` stays in both forms: it is the exact bytes the feed sent, what the project's own machinery
reads (event ids, deduplication, the checks), and what an analyst falls back on. `data` is derived from
it by Spark in the one write path (`FeedTable.write`), in the same job and the same Delta commit as the
rows and the cursor of record: a batch load's commit and a stream's micro-batch both pass there.

What `data` holds, row by row (`docs/configuration/payload-form.md`):
* an object, array, number, boolean: the payload parsed (`try_parse_json(payload)`);
* a JSON string payload, which `payload` holds decoded (`read/rows.py`): that string as a variant
  string (the text is encoded back to JSON and parsed: `payload` alone no longer says it was a string);
* JSON `null`: a variant null (`data IS NULL` is false, `is_variant_null(data)` true);
* a payload Spark's parser refuses (an unpaired surrogate escape `"\\ud800"`, a key twice in one
  object unless the session sets `spark.sql.variant.allowDuplicateKeys`, nesting deeper than Spark
  takes): SQL NULL. The row is loaded all the same, its text in `payload`: a load
  never fails or drops an event over its variant. `data IS NULL` finds exactly these rows.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Literal

from feedapi_dagster.errors import PayloadFormMismatch

if TYPE_CHECKING:
    from pyspark.sql import Column

PayloadForm = Literal["json", "variant"]
DEFAULT_PAYLOAD_FORM: PayloadForm = "json"
DATA_COLUMN = "data"
# the columns a form adds to the table's (`read.rows.TABLE_SCHEMA`), after them, as Spark DDL
FORM_COLUMNS_DDL: dict[PayloadForm, str] = {"json": "", "variant": f"{DATA_COLUMN} VARIANT"}

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


def form_of(column_types: Mapping[str, str]) -> PayloadForm:
    """A table's form from its columns' type names (Spark's `simpleString`, delta-rs's `type`: both
    `variant` for a VARIANT column)."""
    return "variant" if column_types.get(DATA_COLUMN) == "variant" else "json"


def form_mismatch(path: str, found: PayloadForm, wanted: PayloadForm) -> PayloadFormMismatch:
    """A variant table whose feed says json: refused (see `FeedTable.ensure_table` for why)."""
    return PayloadFormMismatch(
        f"the Delta table {path} has the payload's variant column `{DATA_COLUMN}` and the feed's payload_form "
        f"is {wanted}: a load would leave `{DATA_COLUMN}` NULL in its rows, which queries of it would take for "
        f"unparseable payloads. Set `payload_form: {found}` to go on loading this table (its `payload` column "
        "is the JSON text either way), or load the feed into a new table"
    )
