"""What stages and flows share: settings, the CLI runner, console output, paths, the Ray
connection, the pre-flight server checks, the task data adapt and analyze read. Imports no
stage, so any stage can import it.
"""
