"""Stages as plain functions with ``python -m pipelines.<stage>`` entry points (Ray, MLflow).

Importing the package switches the libraries' console chatter off
(:func:`~pipelines.common.console.quiet_environment`) before any stage imports MLflow or Ray,
which read their switches as they are imported, whatever the entry point: ``elmo``,
``python -m pipelines.<stage>`` (as a Ray job runs it too), a flow.
"""

from pipelines.common.console import quiet_environment

quiet_environment()
