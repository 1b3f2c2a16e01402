"""fitcheck: training-memory estimates, fit verdicts and trainer configs.

The library is the product; the CLI (`fitcheck.cli`) is a thin layer over it. Importing this
package is cheap: it pulls in nothing heavier than the standard library.
"""

__version__ = "0.1.0"
