"""The device runner's actor-side pieces (the GPU path, tested on the CPU under CUDA's rules):

staging.py          the step buffers: a host copy the prologue writes (pinned on CUDA) and the
                    device copy the step's kernels read
feature_staging.py  the per-request features a step uses (guidance, penalties, logprobs): their
                    per-lane inputs and device copies
verifier.py         `DeviceVerifier`, the VerifierActor whose step is fixed-shape tensor work
draft_actor.py      `DeviceDraftActor`, the DraftActor whose draft model runs inside the step

The rest of the device runner sits in the layers below, which use it too: the forward
(models/device_llama.py), the draft model (drafters/device_draft.py), the tensor-parallel group
(parallel/device_group.py, parallel/device_worker.py) and the verification law both runners share
(kernels/verify.py).
"""
