from .device import budget_from_device
from .budget import format_bytes, parse_budget, resolve_budget
from .meter import activation_memory, program_memory
from .plan import Plan
from .profile import profile_layers
from .sequence import RematSequence, remat_sequence
