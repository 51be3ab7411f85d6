"""Suite-wide settings.

torch's intra-op threads cost far more than they save on the tiny tensors of
the cache and the reference model (an Engine sets this for itself too); one
thread for the whole session keeps test times independent of test order.
"""

import torch

torch.set_num_threads(1)
