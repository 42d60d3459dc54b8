"""The router's decision side: which chain of models and which draft window each batch runs next.

The front is `scheduling.scheduler.Scheduler`; its docstring maps the modules. This package imports
nothing itself, so that `scheduling.settings` stays cheap to import.
"""
