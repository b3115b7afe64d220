"""What sweepflow's Tune face does behind Ray's names (Ray Train v2's ``_internal`` under its ``api``): a script's
request and its lowering to the one ``Experiment``, run as a ``tune-experiment`` flow run (``runner``); what a
trial of a trainable runs (``trainable``); a script's hooks (``hooks``); trial names (``trial_names``); a Tune
searcher as the sweep's sampler (``searchers``). Imported by the faces only (``sweepflow.tune``, ``.sgd``): a
script uses the modules with Ray's names. The leaves those modules share with them stay beside them
(``shared``: what ``with_parameters`` holds on the workers; ``by_name``: Ray's names resolved to classes)."""
