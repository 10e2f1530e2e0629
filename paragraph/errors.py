"""Errors that paragraph raises for bad input (models, files, options)."""


class ParagraphError(Exception):
    """Base class of every error paragraph raises on purpose."""


class UnsupportedModelError(ParagraphError):
    """The model uses something paragraph cannot represent (dynamic shapes, control flow, ...).

    The message names the offending variable, operator or construct.
    """


class InputError(ParagraphError):
    """Wrong number, shape, dtype or values of a model's inputs (raised before anything runs)."""


class ModelLoadError(ParagraphError):
    """A model source could not be read (missing or corrupt file, unknown format)."""


class ModelTooLargeError(ParagraphError):
    """The model needs more memory than the machine or device has (checked before allocating).

    The message gives the bytes needed and the bytes there are.
    """


class GraphError(ParagraphError):
    """A paragraph.Graph is malformed (cycle, dangling reference, inconsistent types)."""


class RuleLibraryError(ParagraphError):
    """A rule library file is missing, corrupt, hand-edited or holds an unverified rule.

    The message names the file, the rule and what is wrong.
    """
