"""What a Spark publish did (:mod:`messagebox.pipelines.spark_publish`): a report per
partition and one for the job, and the counts a partition keeps as it publishes."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field

from messagebox.models import Outcome, Routed


@dataclass(frozen=True)
class PartitionReport:
    """What one partition did. ``published`` = ``routed + suspended + dropped``."""

    partition: int
    rows: int
    """Rows read (up to the failed batch, when one failed)."""
    published: int
    """Messages this run published (a receipt recorded for each)."""
    skipped: int
    """Rows whose key an earlier (or concurrent) run of the job published."""
    routed: int
    """Published messages routed to at least one subscription."""
    suspended: int
    """Published routing failures stored suspended (``policy="suspend"``)."""
    dropped: int
    """Published routing failures not stored (``policy="drop"``)."""
    batches: int
    """Transactions that stored messages."""
    seconds: float


@dataclass(frozen=True)
class PublishReport:
    """What :func:`publish_dataframe` did: the sums over its partitions."""

    job: str
    rows: int
    published: int
    skipped: int
    routed: int
    suspended: int
    dropped: int
    batches: int
    seconds: float
    parallel: bool
    """True when the executors published (PostgreSQL), False when the driver did."""
    partitions: tuple[PartitionReport, ...] = field(repr=False, default=())

    @classmethod
    def of(
        cls, job: str, parts: Sequence[PartitionReport], seconds: float, parallel: bool
    ) -> PublishReport:
        return cls(
            job=job,
            rows=sum(p.rows for p in parts),
            published=sum(p.published for p in parts),
            skipped=sum(p.skipped for p in parts),
            routed=sum(p.routed for p in parts),
            suspended=sum(p.suspended for p in parts),
            dropped=sum(p.dropped for p in parts),
            batches=sum(p.batches for p in parts),
            seconds=seconds,
            parallel=parallel,
            partitions=tuple(sorted(parts, key=lambda p: p.partition)),
        )

    def __str__(self) -> str:
        return (
            f"job {self.job!r}: {self.rows:,} rows, {self.published:,} published "
            f"({self.routed:,} routed, {self.suspended:,} suspended, {self.dropped:,} "
            f"dropped), {self.skipped:,} skipped as published before, in {self.batches:,} "
            f"batches, {self.seconds:.1f} s"
        )


@dataclass
class Counts:
    """What a partition has done so far."""

    rows: int = 0
    published: int = 0
    skipped: int = 0
    routed: int = 0
    suspended: int = 0
    dropped: int = 0
    batches: int = 0

    def report(self, partition: int, seconds: float) -> PartitionReport:
        return PartitionReport(partition=partition, seconds=seconds, **asdict(self))

    def add(self, results: Sequence[Routed]) -> None:
        self.batches += 1
        self.published += len(results)
        for r in results:
            if r.outcome is Outcome.ROUTED:
                self.routed += 1
            elif r.outcome is Outcome.SUSPENDED:
                self.suspended += 1
            else:
                self.dropped += 1


@dataclass(frozen=True)
class PartitionOutcome:
    """What a partition's task returns to the driver."""

    report: PartitionReport
    error: tuple[str, str] | None = None
    """(messagebox error class name, message) when the partition failed."""


def describe(job: str, r: PartitionReport, error: tuple[str, str] | None) -> str:
    """A partition's report as a log line."""
    text = (
        f"job {job!r} partition {r.partition}: {r.rows:,} rows, {r.published:,} published, "
        f"{r.skipped:,} skipped, {r.batches:,} batches, {r.seconds:.2f} s"
    )
    return text + (f"; failed: {error[0]}: {error[1]}" if error else "")
