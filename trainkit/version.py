"""trainkit's version numbers: its own release, and the Accelerate release whose API it implements.

``trainkit.__version__`` is a PEP 440 version whose public part is the Accelerate release and whose local label is
trainkit's release (``1.15.0+trainkit.0.1.0.dev0``): a script written for Accelerate that gates a feature on
``accelerate.__version__`` after ``import trainkit as accelerate`` compares the API it runs on
(docs/migrating-from-accelerate.md, "Version gates"). This module imports nothing.
"""

__trainkit_version__ = "0.1.0.dev0"
"""trainkit's own release (the package's version, as ``pip show trainkit`` prints it)."""
__accelerate_version__ = "1.15.0"
"""The Accelerate release whose API trainkit implements (``compare_versions("accelerate", ...)`` answers with it)."""
__version__ = f"{__accelerate_version__}+trainkit.{__trainkit_version__}"
"""A PEP 440 version that compares as ``__accelerate_version__`` (its public part) and names trainkit's release
in its local label: a script written for Accelerate that gates a feature on ``accelerate.__version__`` (after
``import trainkit as accelerate``) sees the API it runs on. docs/migrating-from-accelerate.md, "Version gates"."""
