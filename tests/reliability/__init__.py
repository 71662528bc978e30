"""The reliability suite: bad inputs, faults, leaks and secrets, each through the user's path.

Every case runs the real ``lance-lightning`` command (or a real script) in a subprocess and checks
how it ends: one screen naming what is wrong, the parameter, the value and the fix, with the exit
status of a configuration error (1) or a parser error (2), no traceback, no credential, nothing left
behind. A new option of the package adds its bad values here.
"""
