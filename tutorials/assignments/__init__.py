"""Class assignments: one folder per assignment (stub, autograder, solution, README); see tutorials/README.md."""
