"""Eviction and admission policies."""

from kvtier.policies.admission import AdmissionPolicy, SeenCountAdmission, make_admission_policy
from kvtier.policies.eviction import ARCPolicy, EvictionPolicy, LRUPolicy, make_eviction_policy

__all__ = [
    "ARCPolicy",
    "AdmissionPolicy",
    "EvictionPolicy",
    "LRUPolicy",
    "SeenCountAdmission",
    "make_admission_policy",
    "make_eviction_policy",
]
