"""What the integrations share: the one-line error for a missing optional
package. (Plan policy, such as reaching a target batch exactly, is the
tune's own plan: the integrations pass their target and world size to
`tune` and map its plan onto their framework's settings.)"""
from __future__ import annotations


def missing(integration: str, package: str, pip_name: str, error: ImportError) -> ImportError:
    """The one-line error of an integration whose package is not installed."""
    return ImportError(f"{integration} needs {package}, which is not installed "
                       f"({error}); pip install {pip_name}")
