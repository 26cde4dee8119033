"""toast-lab: automatic, inspectable sharding plans for JAX programs.

This module is the one place that says what is public.
"""

__version__ = "0.1.0"
