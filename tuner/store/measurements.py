"""Measurements in the store: one row per candidate implementation measured for one operator
signature on one hardware/software combination, committed at once so that an interrupted
tuning run keeps every measurement it made; looked up singly or as the ranked candidates of a
signature."""

from __future__ import annotations

from tuner.store.connection import StoreConnection
from tuner.store.errors import StoreError
from tuner.store.rows import StoredMeasurement, _measurement_from_row, _now

#: The signature prefix of a candidate's NaN/Inf verdict (:mod:`tuner.nonfinite`), stored in
#: the measurements table beside its timing.
VERDICT_PREFIX = "nonfinite:"


class MeasurementQueries(StoreConnection):
    """The ``measurements`` table of a :class:`~tuner.store.PlanStore`."""

    def put_measurement(
        self,
        signature: str,
        candidate: str,
        hardware_digest: str,
        software_digest: str,
        *,
        median_s: float | None = None,
        spread_s: float | None = None,
        samples: int = 0,
        error: str | None = None,
    ) -> None:
        """Record (or replace) one measurement, committed at once so that an interrupted
        tuning run keeps it. ``error`` marks a candidate that failed or gave wrong results."""
        if median_s is None and error is None:
            raise StoreError(
                f"put_measurement({signature!r}, {candidate!r}): expected median_s or error, "
                f"received neither"
            )
        row = [signature, candidate, hardware_digest, software_digest,
               None if median_s is None else float(median_s),
               None if spread_s is None else float(spread_s), int(samples), error, _now()]
        with self._write("put_measurement"):
            self._conn.execute(
                """INSERT INTO measurements (signature, candidate, hardware_digest,
                       software_digest, median_s, spread_s, samples, error, created_at)
                   VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)
                   ON CONFLICT (signature, candidate, hardware_digest, software_digest)
                   DO UPDATE SET median_s = excluded.median_s, spread_s = excluded.spread_s,
                       samples = excluded.samples, error = excluded.error,
                       created_at = excluded.created_at""",
                row,
            )

    def get_measurement(
        self, signature: str, candidate: str, hardware_digest: str, software_digest: str,
    ) -> StoredMeasurement | None:
        """The measurement of ``candidate`` for ``signature`` on this hardware and software."""
        rows = list(self._query(
            "SELECT * FROM measurements WHERE signature = ? AND candidate = ? "
            "AND hardware_digest = ? AND software_digest = ?",
            [signature, candidate, hardware_digest, software_digest]))
        return _measurement_from_row(rows[0]) if rows else None

    def measurements_for(
        self, signature: str, hardware_digest: str, software_digest: str,
    ) -> list[StoredMeasurement]:
        """Every candidate measured for ``signature`` on this hardware and software, fastest
        first (failed ones last)."""
        return [_measurement_from_row(r) for r in self._query(
            "SELECT * FROM measurements WHERE signature = ? AND hardware_digest = ? "
            "AND software_digest = ? ORDER BY error IS NOT NULL, median_s IS NULL, median_s, "
            "candidate", [signature, hardware_digest, software_digest])]

    def count_measurements(self) -> int:
        """How many measurements the store holds (timings; the NaN/Inf verdicts the tuner
        keeps in the same table, under signatures starting with :data:`VERDICT_PREFIX`, are
        not counted)."""
        return int(self._conn.execute(
            "SELECT count(*) FROM measurements WHERE substr(signature, 1, ?) != ?",
            [len(VERDICT_PREFIX), VERDICT_PREFIX]).fetchone()[0])
