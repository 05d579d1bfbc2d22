"""The filter language: ``P`` references, predicates, DNF filters, their evaluators, their
text form and explanations."""

from messagebox.predicates.dsl import And, Or, P, to_filter
from messagebox.predicates.evaluate import filter_matches, normalize_properties, predicate_holds
from messagebox.predicates.explain import (
    FilterExplanation,
    GroupExplanation,
    PredicateCheck,
    explain,
)
from messagebox.predicates.model import (
    MAX_GROUPS,
    MAX_IN_VALUES,
    MAX_NESTING,
    MAX_PREDICATES_PER_GROUP,
    Filter,
    Group,
    Op,
    Predicate,
)
from messagebox.predicates.text import format_filter, parse_filter

__all__ = [
    "MAX_GROUPS",
    "MAX_IN_VALUES",
    "MAX_NESTING",
    "MAX_PREDICATES_PER_GROUP",
    "And",
    "Filter",
    "FilterExplanation",
    "Group",
    "GroupExplanation",
    "Op",
    "Or",
    "P",
    "Predicate",
    "PredicateCheck",
    "explain",
    "filter_matches",
    "format_filter",
    "normalize_properties",
    "parse_filter",
    "predicate_holds",
    "to_filter",
]
