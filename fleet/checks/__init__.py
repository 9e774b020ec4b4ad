"""Checks: rules that span several fields of a loaded fleet, each a located problem."""
