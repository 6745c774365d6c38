"""dyn.cli: the Typer app. Flags become typed configs; no serving logic lives here."""
