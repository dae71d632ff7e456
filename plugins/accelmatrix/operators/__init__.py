"""Operators: the steps of a cell that need more than a TaskFlow function."""
