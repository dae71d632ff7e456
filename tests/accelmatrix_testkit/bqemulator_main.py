"""Start bqemulator (run by the emulator venv's python, never imported by the tests).

bqemulator 1.4.0 insists on loading DuckDB's ``spatial`` extension at start (for GEOGRAPHY)
and downloads it from DuckDB's extension site, which these machines cannot reach; PyPI's
duckdb-ext-spatial is built for DuckDB 1.4 only, which bqemulator 1.4.0's UDFs do not
support. The warehouse uses no GEOGRAPHY, so the load is made best-effort here, the way
bqemulator already treats its ``avro`` extension; nothing else is changed.
"""

import sys

from bqemulator.storage import engine


def _spatial_if_present(self) -> None:
    try:
        self._connection.execute("LOAD spatial")
    except Exception:  # noqa: BLE001 - GEOGRAPHY queries fail; nothing else needs it
        pass


engine.DuckDBEngine._load_spatial = _spatial_if_present

if __name__ == "__main__":
    from bqemulator.cli import main

    sys.argv = ["bqemulator", *sys.argv[1:]]
    main()
