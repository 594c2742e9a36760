package kubealloc

import (
	"k8s.io/client-go/rest"
)

// Client-side rate limits for the allocator's clients when none are given. client-go's own
// defaults (5 requests/s, bursts of 10) would hold a manager to under two allocations a second
// (each takes three writes, and the pool's replacement pods one more).
const (
	DefaultQPS   = 200
	DefaultBurst = 400
)

// ClientConfigs derives from cfg the configurations of the allocator's two clients: typed
// (kubernetes.Interface: pods, leases) and dynamic (CiliumNetworkPolicies). Both get qps and
// burst (DefaultQPS and DefaultBurst when zero). The typed client speaks protobuf, which the
// API server encodes and decodes faster than JSON for pods, the objects on the allocation
// path; the dynamic client stays on JSON, the only encoding custom resources have. cfg is not
// modified.
func ClientConfigs(cfg *rest.Config, qps float32, burst int) (typed, dynamic *rest.Config) {
	if qps <= 0 {
		qps = DefaultQPS
	}
	if burst <= 0 {
		burst = DefaultBurst
	}
	typed, dynamic = rest.CopyConfig(cfg), rest.CopyConfig(cfg)
	typed.QPS, typed.Burst = qps, burst
	dynamic.QPS, dynamic.Burst = qps, burst
	typed.ContentType = "application/vnd.kubernetes.protobuf"
	typed.AcceptContentTypes = "application/vnd.kubernetes.protobuf,application/json"
	return typed, dynamic
}
