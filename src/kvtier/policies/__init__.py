"""Eviction and admission policies."""

from kvtier.policies.admission import AdmissionPolicy, SeenCountAdmission, make_admission_policy
from kvtier.policies.eviction import ARCPolicy, EvictionPolicy, LRUPolicy
from kvtier.policies.registry import eviction_names, make_eviction_policy, register_eviction

__all__ = [
    "ARCPolicy",
    "AdmissionPolicy",
    "EvictionPolicy",
    "LRUPolicy",
    "SeenCountAdmission",
    "make_admission_policy",
    "eviction_names",
    "make_eviction_policy",
    "register_eviction",
]
