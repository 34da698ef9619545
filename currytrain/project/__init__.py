"""Projects outside the curryTrain checkout: `currytrain init DIR` makes one (init.py), `currytrain scaffold
NAME` adds an idea to it (scaffold.py). Both render the files under templates/ and write them through
files.write_files, which checks every path before it writes any.
"""
