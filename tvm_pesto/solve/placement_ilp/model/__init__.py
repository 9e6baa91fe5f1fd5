"""The placement MIP, one model cut in three: ``build`` (variables, objective, the model
built and a plan read from its solution), ``constraints`` (its constraint families) and
``warm`` (a warm start's values).
"""
