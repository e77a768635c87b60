"""What stages and flows share: settings, the CLI runner, console output, paths, the Ray
connection, the pre-flight server checks. Imports no stage, so any stage can import it.
"""
