"""``dyn keys``: make the CurveZMQ keys that secure every ZMQ plane (``--plane-keys``)."""

from __future__ import annotations

import typer


def keys(
    directory: str = typer.Argument(..., help="Directory to write the keys to (created 0700)."),
) -> None:
    """Make a CurveZMQ key directory for --plane-keys: a server and a client keypair, each file
    0600 in a directory only you may enter. Copy it (over a secure channel) to every machine of
    the deployment and pass --plane-keys DIR to every dyn process: the ZMQ planes are then
    encrypted, only holders of the keys may connect, and they may listen beyond loopback. To
    admit another client key, add its public NAME.key file to the directory."""
    from dyn.core.transport.sockets import PlaneKeyError, write_plane_keys

    try:
        path = write_plane_keys(directory)
    except PlaneKeyError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None
    typer.echo(f"wrote CurveZMQ plane keys to {path}; pass --plane-keys {path} to every dyn process")


def register(app: typer.Typer) -> None:
    """Add this command to ``app`` (``dyn.cli.app``'s loaders)."""
    app.command("keys")(keys)
