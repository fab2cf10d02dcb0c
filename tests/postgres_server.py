"""A throwaway PostgreSQL 15 server for the tests (Debian's `postgresql-15`, which `make postgres`
installs): `initdb` into a folder of its own (as the `postgres` OS user when the tests run as root:
initdb and the server refuse root), started by `pg_ctl` on 127.0.0.1 and a free port, its Unix socket
in its folder, local and TCP connections trusted (nothing but this machine reaches it); `stop()`
stops it with `pg_ctl stop -m fast` and removes the folder."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path

POSTGRES_BIN = Path("/usr/lib/postgresql/15/bin")
POSTGRES_OS_USER = "postgres"


def missing() -> str | None:
    """Why a server cannot be started here (None: it can)."""
    absent = [name for name in ("initdb", "pg_ctl", "postgres") if not os.access(POSTGRES_BIN / name, os.X_OK)]
    if absent:
        return f"no PostgreSQL 15 server binaries in {POSTGRES_BIN} ({', '.join(absent)}): run `make postgres`"
    return None


class PostgresServer:
    def __init__(self, port: int):
        self.port = port
        # not under pytest's tmp folders, which are 0700 to root: the postgres user must reach it
        self.root = Path(tempfile.mkdtemp(prefix="feedapi-dagster-postgres-"))
        self.root.chmod(0o755)
        self.data = self.root / "data"
        self._as_user: list[str] = []
        if os.geteuid() == 0:
            shutil.chown(self.root, POSTGRES_OS_USER, POSTGRES_OS_USER)
            self._as_user = ["runuser", "-u", POSTGRES_OS_USER, "--"]

    def _run(self, *command: str) -> None:
        subprocess.run(
            [*self._as_user, *command],
            cwd=self.root,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            check=True,
            timeout=120,
        )

    def start(self) -> None:
        self._run(str(POSTGRES_BIN / "initdb"), "-D", str(self.data), "-U", "postgres", "--auth=trust", "-E", "UTF8")
        options = f"-c listen_addresses=127.0.0.1 -c port={self.port} -c unix_socket_directories={self.root}"
        self._run(
            str(POSTGRES_BIN / "pg_ctl"), "-D", str(self.data), "-l", str(self.root / "server.log"),
            "-o", options, "-w", "-t", "60", "start",
        )  # fmt: skip

    def create_database(self, name: str) -> None:
        import psycopg2  # dagster-postgres's driver

        connection = psycopg2.connect(host=str(self.root), port=self.port, user="postgres", dbname="postgres")
        try:
            connection.autocommit = True  # CREATE DATABASE runs outside a transaction
            with connection.cursor() as cursor:
                cursor.execute(f'CREATE DATABASE "{name}"')
        finally:
            connection.close()

    def url(self, database: str, scheme: str = "postgresql+psycopg2") -> str:
        return f"{scheme}://postgres@127.0.0.1:{self.port}/{database}"

    def stop(self) -> None:
        try:
            self._run(str(POSTGRES_BIN / "pg_ctl"), "-D", str(self.data), "-m", "fast", "-w", "-t", "60", "stop")
        finally:
            shutil.rmtree(self.root, ignore_errors=True)
