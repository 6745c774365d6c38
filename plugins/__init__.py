"""dyn.plugins: engines implementing dyn.core.engine.Engine, registered under the `dyn.engines` entry points."""
