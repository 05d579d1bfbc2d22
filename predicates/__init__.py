"""The filter language: ``P`` references, predicates, DNF filters and their evaluators."""

from predicates.dsl import And, Or, P, to_filter
from predicates.evaluate import filter_matches, normalize_properties, predicate_holds
from predicates.model import (
    MAX_GROUPS,
    MAX_IN_VALUES,
    MAX_PREDICATES_PER_GROUP,
    Filter,
    Group,
    Op,
    Predicate,
)

__all__ = [
    "MAX_GROUPS",
    "MAX_IN_VALUES",
    "MAX_PREDICATES_PER_GROUP",
    "And",
    "Filter",
    "Group",
    "Op",
    "Or",
    "P",
    "Predicate",
    "filter_matches",
    "normalize_properties",
    "predicate_holds",
    "to_filter",
]
