package infra

import (
	"fmt"
	"maps"
	"net/url"
	"slices"
	"strings"

	"github.com/fusebox-dev/fusebox/components"
)

// keyError is a configuration error naming its key.
type keyError struct {
	key string
	err error
}

// Hosts returns every host the program renders into an object, by the configuration key it
// comes from: image registries (images.*, templates[*].image, gvisor.installerImage,
// cilium.images.*), the gVisor
// download base on eks (gvisor.binaryBaseURL, whose default is gVisor's public bucket), the Cilium
// chart repository, and the public registries the Cilium chart's own images name when it is
// installed without cilium.images.
func (c *Config) Hosts() map[string][]string {
	hosts := map[string][]string{}
	add := func(key, host string) { hosts[key] = append(hosts[key], host) }
	add("images.manager", imageHost(c.Images.Manager))
	add("images.sandbox", imageHost(c.Images.Sandbox))
	for i, t := range c.Templates {
		add(fmt.Sprintf("templates[%d].image", i), imageHost(t.Image))
	}
	if c.Cloud == components.EKS {
		add("gvisor.binaryBaseURL", urlHost(c.GVisor.baseURL()))
	}
	if c.Cloud == components.EKS || c.Cloud == components.AKS {
		if c.GVisor.InstallerImage != "" {
			add("gvisor.installerImage", imageHost(c.GVisor.InstallerImage))
		}
	}
	if c.Cilium.Install {
		if c.Cilium.Chart.Path == "" {
			add("cilium.chart.repo", urlHost(c.Cilium.Chart.Repo))
		}
		for key, ref := range map[string]string{"agent": c.Cilium.Images.Agent, "operator": c.Cilium.Images.Operator, "envoy": c.Cilium.Images.Envoy} {
			if ref == "" {
				add("cilium.images."+key, "quay.io") // the chart's default
				continue
			}
			add("cilium.images."+key, imageHost(ref))
		}
	}
	return hosts
}

// CheckInVPC fails, naming the key, when any host the program renders is not one of
// PrivateHosts ("registry.internal", or "*.corp.example" for any name below corp.example).
func (c *Config) CheckInVPC() *keyError {
	hosts := c.Hosts()
	for _, key := range sortedKeys(hosts) {
		for _, h := range hosts[key] {
			if !c.privateHost(h) {
				return &keyError{key, fmt.Errorf("names host %s, which is not in privateHosts %v: with inVPC: true every image, download and chart comes from inside the VPC", h, c.PrivateHosts)}
			}
		}
	}
	return nil
}

func (c *Config) privateHost(h string) bool {
	h = strings.ToLower(h)
	for _, p := range c.PrivateHosts {
		p = strings.ToLower(p)
		if suffix, ok := strings.CutPrefix(p, "*."); ok {
			if strings.HasSuffix(h, "."+suffix) {
				return true
			}
		} else if h == p {
			return true
		}
	}
	return false
}

// imageHost is the registry host of an image reference (docker.io when it names none).
func imageHost(ref string) string {
	first, _, ok := strings.Cut(ref, "/")
	if !ok || (!strings.ContainsAny(first, ".:") && first != "localhost") {
		return "docker.io"
	}
	host, _, _ := strings.Cut(first, ":")
	return host
}

// urlHost is the host of a URL, without its port.
func urlHost(raw string) string {
	u, err := url.Parse(raw)
	if err != nil || u.Host == "" {
		return raw
	}
	return u.Hostname()
}

func sortedKeys(m map[string][]string) []string { return slices.Sorted(maps.Keys(m)) }
