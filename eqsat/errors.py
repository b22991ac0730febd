"""One error hierarchy for everything a user can get wrong.

Messages name the input (file, op, rule) and what was wrong with it; the CLI prints them without a
traceback.
"""


class EqsatError(Exception):
    """Base of every error eqsat raises on purpose."""


class ShapeError(EqsatError):
    """An op was given inputs whose shapes or attributes it cannot accept."""


class UnknownOpError(EqsatError):
    """An op name that no registry entry defines."""


class GraphFormatError(EqsatError):
    """A graph file (Graph JSON, TASO .model) that cannot be read."""


class EGraphFormatError(EqsatError):
    """An E-graph JSON file that is malformed or inconsistent."""


class RuleParseError(EqsatError):
    """A rule file line that does not parse."""


class RuleError(EqsatError):
    """A rule that misbehaves when run (e.g. merges two e-classes of different shapes)."""


class LimitError(EqsatError):
    """A resource limit that was hit where no partial answer makes sense."""


class ExtractionError(EqsatError):
    """An extraction that cannot produce a valid selection (e.g. a root with no acyclic choice)."""


class NumericsError(EqsatError):
    """An optimized graph that disagrees with the original on random inputs."""
