"""What the examples know about Caroline: the memory one user gathers in a few weeks.

With the default answer-quality policy the last ``recompute_tail`` (4) facts of a prompt
are computed from text; at ``k=10`` the KV of the 6 facts before them is injected.
"""

CAROLINE = [
    "Caroline moved to Berlin in May 2023.",
    "Caroline works as a nurse at a children's hospital.",
    "Caroline's sister is called Ana.",
    "Caroline has a golden retriever called Biscuit.",
    "Caroline is learning to play the cello.",
    "Caroline's favourite food is ramen.",
    "Caroline goes swimming every Tuesday morning.",
    "Caroline grew up in Leeds.",
    "Caroline is vegetarian since 2019.",
    "Caroline's birthday is on 14 March.",
    "Caroline takes German lessons on Thursday evenings.",
    "Caroline shares her flat with a friend called Ines.",
    "Caroline volunteers at an animal shelter on Sundays.",
    "Caroline studied nursing at the University of Manchester.",
    "Caroline drinks oat milk in her coffee.",
    "Caroline is saving money for a trip to Iceland.",
    "Caroline's favourite band is Fleetwood Mac.",
    "Caroline broke her wrist skiing in 2020.",
    "Caroline bakes sourdough bread every weekend.",
    "Caroline's best friend Priya is a doctor in London.",
    "Caroline plays volleyball in a league on Wednesdays.",
    "Caroline is afraid of heights.",
    "Caroline prefers trains to planes for short trips.",
    "Caroline listens to podcasts about history.",
    "Caroline wears glasses for reading.",
    "Caroline's brother Tom lives in Dublin.",
    "Caroline cycles to work on an old green bicycle.",
    "Caroline works night shifts twice a month.",
    "Caroline visited Japan in spring 2022.",
    "Caroline wants to adopt a second dog.",
]
