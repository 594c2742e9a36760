package manager

import (
	"maps"
	"slices"
	"strings"

	"github.com/fusebox-dev/fusebox/components"
	appsv1 "github.com/pulumi/pulumi-kubernetes/sdk/v4/go/kubernetes/apps/v1"
	corev1 "github.com/pulumi/pulumi-kubernetes/sdk/v4/go/kubernetes/core/v1"
	metav1 "github.com/pulumi/pulumi-kubernetes/sdk/v4/go/kubernetes/meta/v1"
	"github.com/pulumi/pulumi/sdk/v3/go/pulumi"
)

// deploymentSpec is the manager's Deployment: Replicas pods, rolled one at a time with none
// unavailable, each labelled labels and annotated annotations (the checksums of the ConfigMaps
// it reads: a change of one rolls the pods).
func (a *ManagerArgs) deploymentSpec(labels, annotations pulumi.StringMap) appsv1.DeploymentSpecArgs {
	return appsv1.DeploymentSpecArgs{
		Replicas: pulumi.Int(a.Replicas),
		Selector: metav1.LabelSelectorArgs{MatchLabels: selectorLabels()},
		Strategy: appsv1.DeploymentStrategyArgs{
			Type: pulumi.String("RollingUpdate"),
			RollingUpdate: appsv1.RollingUpdateDeploymentArgs{
				MaxUnavailable: pulumi.Int(0), MaxSurge: pulumi.Int(1),
			},
		},
		Template: corev1.PodTemplateSpecArgs{
			Metadata: metav1.ObjectMetaArgs{Labels: labels, Annotations: annotations},
			Spec:     a.podSpec(),
		},
	}
}

// podSpec is a manager pod: its ServiceAccount, spread over nodes, non-root, one container,
// the ConfigMaps it reads and two small writable emptyDirs.
func (a *ManagerArgs) podSpec() corev1.PodSpecArgs {
	return corev1.PodSpecArgs{
		ServiceAccountName: pulumi.String(ObjectName),
		Affinity:           corev1.AffinityArgs{PodAntiAffinity: a.antiAffinity()},
		SecurityContext: corev1.PodSecurityContextArgs{
			RunAsNonRoot:   pulumi.Bool(true),
			RunAsUser:      pulumi.Int(nonRootUID),
			RunAsGroup:     pulumi.Int(nonRootUID),
			FsGroup:        pulumi.Int(nonRootUID),
			SeccompProfile: corev1.SeccompProfileArgs{Type: pulumi.String("RuntimeDefault")},
		},
		Containers:       corev1.ContainerArray{a.container()},
		Volumes:          volumes(),
		ImagePullSecrets: pullSecrets(a.ImagePullSecrets),
	}
}

// antiAffinity keeps two replicas off one node: required, or (single-node dev clusters) only
// preferred.
func (a *ManagerArgs) antiAffinity() corev1.PodAntiAffinityArgs {
	term := corev1.PodAffinityTermArgs{
		LabelSelector: metav1.LabelSelectorArgs{MatchLabels: selectorLabels()},
		TopologyKey:   pulumi.String("kubernetes.io/hostname"),
	}
	anti := corev1.PodAntiAffinityArgs{}
	if a.RequiredAntiAffinity {
		anti.RequiredDuringSchedulingIgnoredDuringExecution = corev1.PodAffinityTermArray{term}
	} else {
		anti.PreferredDuringSchedulingIgnoredDuringExecution = corev1.WeightedPodAffinityTermArray{
			corev1.WeightedPodAffinityTermArgs{Weight: pulumi.Int(100), PodAffinityTerm: term},
		}
	}
	return anti
}

// container is the manager container: fusebox-manager with its flags, the pod's name and
// namespace in its environment, gRPC probes, resources, a restricted security context and
// its mounts.
func (a *ManagerArgs) container() corev1.ContainerArgs {
	yes, no := pulumi.Bool(true), pulumi.Bool(false)
	return corev1.ContainerArgs{
		Name:  pulumi.String("manager"),
		Image: pulumi.String(a.Image),
		Args:  append(a.flags(), a.listArgs()...),
		Env: corev1.EnvVarArray{
			fieldEnv("POD_NAMESPACE", "metadata.namespace"),
			fieldEnv("POD_NAME", "metadata.name"),
		},
		Ports: corev1.ContainerPortArray{
			corev1.ContainerPortArgs{Name: pulumi.String("grpc"), ContainerPort: pulumi.Int(a.GRPCPort)},
			corev1.ContainerPortArgs{Name: pulumi.String("metrics"), ContainerPort: pulumi.Int(a.MetricsPort)},
		},
		// Liveness and startup ask for the health service's overall status, SERVING once the
		// process serves; readiness for the Manager service's, SERVING once the warm pool has
		// first held a ready sandbox (so Pulumi's wait for the Deployment covers the pool).
		StartupProbe:   a.probe("", 2, 30),
		ReadinessProbe: a.probe(ReadinessService, 2, 2),
		LivenessProbe:  a.probe("", 10, 3),
		Resources: corev1.ResourceRequirementsArgs{
			Requests: pulumi.StringMap{"cpu": pulumi.String(a.CPU), "memory": pulumi.String(a.Memory)},
			Limits:   pulumi.StringMap{"memory": pulumi.String(a.Memory)},
		},
		SecurityContext: corev1.SecurityContextArgs{
			RunAsNonRoot:             yes,
			AllowPrivilegeEscalation: no,
			ReadOnlyRootFilesystem:   yes,
			Privileged:               no,
			Capabilities:             corev1.CapabilitiesArgs{Drop: pulumi.StringArray{pulumi.String("ALL")}},
			SeccompProfile:           corev1.SeccompProfileArgs{Type: pulumi.String("RuntimeDefault")},
		},
		VolumeMounts: corev1.VolumeMountArray{
			corev1.VolumeMountArgs{Name: pulumi.String("sandbox-template"), MountPath: pulumi.String(templateMountPath), ReadOnly: yes},
			corev1.VolumeMountArgs{Name: pulumi.String("policy"), MountPath: pulumi.String(policyMountPath), ReadOnly: yes},
			corev1.VolumeMountArgs{Name: pulumi.String("tmp"), MountPath: pulumi.String("/tmp")},
			corev1.VolumeMountArgs{Name: pulumi.String("state"), MountPath: pulumi.String(StateDir)},
		},
	}
}

// flags are the flags of fusebox-manager, the image's entrypoint (cmd/internal/daemoncmd),
// but the list-valued ones (listArgs). Kubernetes expands $(POD_NAMESPACE) and $(POD_NAME)
// from the container's environment.
func (a *ManagerArgs) flags() pulumi.StringArray {
	return pulumi.StringArray{
		pulumi.Sprintf("--listen=tcp://0.0.0.0:%d", a.GRPCPort),
		pulumi.Sprintf("--metrics-listen=0.0.0.0:%d", a.MetricsPort),
		// The allocator: sandbox pods in the sandbox namespace, for the agents selected by
		// AgentLabels, with the flavour's per-sandbox network policies.
		pulumi.String("--allocator=kube"),
		pulumi.Sprintf("--sandbox-namespace=%s", a.SandboxNamespace),
		pulumi.String("--manager-namespace=$(POD_NAMESPACE)"),
		pulumi.String("--identity=$(POD_NAME)"),
		pulumi.String("--sandbox-image=" + a.Sandbox.Image),
		pulumi.String("--sandbox-template=" + SandboxTemplatePath),
		pulumi.String("--agent-selector=" + labelList(a.AgentLabels)),
		pulumi.String("--manager-selector=app.kubernetes.io/name=" + components.ManagerAppLabel),
		pulumi.String("--network-policy=" + a.NetworkPolicy),
		pulumi.String("--state-dir=" + StateDir),
		pulumi.String("--leader-elect=true"),
		// Once its own Deployment is being deleted, the manager removes every sandbox pod
		// and then the Deployment's RemovalFinalizer (see children.deployment).
		pulumi.String("--deployment=" + ObjectName),
		pulumi.Sprintf("--estimator=%s", a.Estimator),
		pulumi.Sprintf("--pool-size=%d", a.PoolSize),
		pulumi.Sprintf("--pool-max=%d", a.PoolMax),
		// The API: TLS with the Secret's certificate for the Service's names, agents' tokens
		// checked for the audience, the authorisation policy.
		pulumi.String("--tls-secret=" + a.tlsSecret()),
		pulumi.Sprintf("--tls-secret-create=%t", a.TLSSecret == ""),
		pulumi.Sprintf("--tls-dns-names=%s,%s.%s,%s.%s.svc,%s.%s.svc.cluster.local%s", ObjectName, ObjectName, a.Namespace,
			ObjectName, a.Namespace, ObjectName, a.Namespace, externalNames(a.ExternalNames)),
		pulumi.String("--ca-configmap=" + CAConfigMapName),
		pulumi.String("--token-audience=" + a.TokenAudience),
		pulumi.String("--auth-policy=" + policyMountPath + "/" + PolicyKey),
	}
}

// externalNames are names, after the Service's in-cluster ones in --tls-dns-names.
func externalNames(names []string) string {
	if len(names) == 0 {
		return ""
	}
	return "," + strings.Join(names, ",")
}

// listArgs are the manager's list-valued flags that are set, and --cluster-dns and
// --templates when set.
func (a *ManagerArgs) listArgs() pulumi.StringArray {
	var out pulumi.StringArray
	for _, f := range []struct {
		flag string
		vals []string
	}{{"--agent-namespaces", a.AgentNamespaces}, {"--agent-cidrs", a.AgentCIDRs}, {"--image-pull-secrets", a.ImagePullSecrets}} {
		if len(f.vals) > 0 {
			out = append(out, pulumi.String(f.flag+"="+strings.Join(f.vals, ",")))
		}
	}
	if a.ClusterDNS != "" {
		out = append(out, pulumi.String("--cluster-dns="+a.ClusterDNS))
	}
	if len(a.Templates) > 0 {
		out = append(out, pulumi.String("--templates="+TemplatesPath))
	}
	return out
}

// probe asks the manager's gRPC health service for service's status every period seconds.
func (a *ManagerArgs) probe(service string, period, failures int) corev1.ProbeArgs {
	return corev1.ProbeArgs{
		Grpc:             corev1.GRPCActionArgs{Port: pulumi.Int(a.GRPCPort), Service: pulumi.String(service)},
		PeriodSeconds:    pulumi.Int(period),
		FailureThreshold: pulumi.Int(failures),
	}
}

// fieldEnv is environment variable name set to the pod's field path.
func fieldEnv(name, path string) corev1.EnvVarArgs {
	return corev1.EnvVarArgs{
		Name: pulumi.String(name),
		ValueFrom: corev1.EnvVarSourceArgs{FieldRef: corev1.ObjectFieldSelectorArgs{
			FieldPath: pulumi.String(path),
		}},
	}
}

// volumes are the sandbox template and the policy (ConfigMaps), /tmp and the state
// directory (emptyDirs: the root filesystem is read-only).
func volumes() corev1.VolumeArray {
	return corev1.VolumeArray{
		corev1.VolumeArgs{
			Name:      pulumi.String("sandbox-template"),
			ConfigMap: corev1.ConfigMapVolumeSourceArgs{Name: pulumi.String(TemplateCMName)},
		},
		corev1.VolumeArgs{
			Name:      pulumi.String("policy"),
			ConfigMap: corev1.ConfigMapVolumeSourceArgs{Name: pulumi.String(PolicyCMName)},
		},
		corev1.VolumeArgs{
			Name:     pulumi.String("tmp"),
			EmptyDir: corev1.EmptyDirVolumeSourceArgs{SizeLimit: pulumi.String("64Mi")},
		},
		corev1.VolumeArgs{
			Name:     pulumi.String("state"),
			EmptyDir: corev1.EmptyDirVolumeSourceArgs{SizeLimit: pulumi.String("16Mi")},
		},
	}
}

// labelList renders labels as the manager's key=value,key=value flags (sorted).
func labelList(m map[string]string) string {
	var parts []string
	for _, k := range slices.Sorted(maps.Keys(m)) {
		parts = append(parts, k+"="+m[k])
	}
	return strings.Join(parts, ",")
}

func pullSecrets(names []string) corev1.LocalObjectReferenceArray {
	var out corev1.LocalObjectReferenceArray
	for _, n := range names {
		out = append(out, corev1.LocalObjectReferenceArgs{Name: pulumi.String(n)})
	}
	return out
}

func selectorLabels() pulumi.StringMap {
	return pulumi.StringMap{"app.kubernetes.io/name": pulumi.String(components.ManagerAppLabel)}
}
