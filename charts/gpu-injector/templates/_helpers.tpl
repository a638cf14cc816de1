{{/*
Names. fullname is capped at 52 characters so that the longest derived name that must be
a DNS label, "<fullname>-nodeprobe", stays within 63 characters; the Service
"<fullname>-webhook" must be one too.
*/}}
{{- define "gpu-injector.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "gpu-injector.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 52 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 52 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 52 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "gpu-injector.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "gpu-injector.labels" -}}
helm.sh/chart: {{ include "gpu-injector.chart" . }}
app.kubernetes.io/name: {{ include "gpu-injector.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: gpu-injector
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{/* Selector labels never change after install: a Deployment's selector is immutable. */}}
{{- define "gpu-injector.selectorLabels" -}}
app.kubernetes.io/name: {{ include "gpu-injector.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "gpu-injector.webhook.name" -}}
{{- printf "%s-webhook" (include "gpu-injector.fullname" .) }}
{{- end }}

{{- define "gpu-injector.nodeprobe.name" -}}
{{- printf "%s-nodeprobe" (include "gpu-injector.fullname" .) }}
{{- end }}

{{- define "gpu-injector.webhook.labels" -}}
{{ include "gpu-injector.labels" . }}
app.kubernetes.io/component: webhook
{{- end }}

{{- define "gpu-injector.webhook.selectorLabels" -}}
{{ include "gpu-injector.selectorLabels" . }}
app.kubernetes.io/component: webhook
{{- end }}

{{- define "gpu-injector.nodeprobe.labels" -}}
{{ include "gpu-injector.labels" . }}
app.kubernetes.io/component: nodeprobe
{{- end }}

{{- define "gpu-injector.nodeprobe.selectorLabels" -}}
{{ include "gpu-injector.selectorLabels" . }}
app.kubernetes.io/component: nodeprobe
{{- end }}

{{- define "gpu-injector.validateHook.name" -}}
{{- printf "%s-validate" (include "gpu-injector.fullname" .) }}
{{- end }}

{{- define "gpu-injector.validateHook.labels" -}}
{{ include "gpu-injector.labels" . }}
app.kubernetes.io/component: validate
{{- end }}

{{- define "gpu-injector.webhook.serviceAccountName" -}}
{{- default (include "gpu-injector.webhook.name" .) .Values.webhook.serviceAccount.name }}
{{- end }}

{{- define "gpu-injector.nodeprobe.serviceAccountName" -}}
{{- default (include "gpu-injector.nodeprobe.name" .) .Values.nodeprobe.serviceAccount.name }}
{{- end }}

{{- define "gpu-injector.webhook.serviceName" -}}
{{- include "gpu-injector.webhook.name" . }}
{{- end }}

{{- define "gpu-injector.certSecretName" -}}
{{- printf "%s-webhook-tls" (include "gpu-injector.fullname" .) }}
{{- end }}

{{- define "gpu-injector.configMapName" -}}
{{- printf "%s-config" (include "gpu-injector.fullname" .) }}
{{- end }}

{{- define "gpu-injector.image" -}}
{{- $tag := default .Chart.AppVersion .Values.image.tag }}
{{- if .Values.image.digest }}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest }}
{{- else }}
{{- printf "%s:%s" .Values.image.repository $tag }}
{{- end }}
{{- end }}

{{/*
self: the binary mints and rotates its own serving certificate and injects its CA.
external: something else does: cert-manager, or, with webhook.url, whoever runs the
out-of-cluster webhook and hands its CA in webhook.caBundle (the binary could not
inject a CA for a URL its certificate does not name).
*/}}
{{- define "gpu-injector.certMode" -}}
{{- if or .Values.certManager.enabled .Values.webhook.url }}external{{ else }}self{{ end }}
{{- end }}

{{/*
The configuration file, rendered from .Values.config with the fixed apiVersion and kind.
Both the ConfigMap and the checksum annotation of the pods use this one definition, so a
change of any config value rolls the pods.
*/}}
{{/*
The ConfigMap and Lease of the remembered pool layouts.
*/}}
{{- define "gpu-injector.poolMemoryName" -}}
{{- printf "%s-pools" (include "gpu-injector.fullname" .) }}
{{- end }}

{{- define "gpu-injector.configYAML" -}}
{{- $c := deepCopy .Values.config }}
{{- $_ := set $c "apiVersion" "config.gpu-injector.io/v1alpha1" }}
{{- $_ := set $c "kind" "InjectorConfiguration" }}
{{- toYaml $c }}
{{- end }}

{{/*
Namespaces the API server never sends to the webhook: the release namespace (the
webhook must never depend on itself), kube-system, and the configured exclusions, which
the webhook also enforces itself.
*/}}
{{- define "gpu-injector.excludedNamespaces" -}}
{{- $ns := list .Release.Namespace "kube-system" }}
{{- range .Values.config.excludedNamespaces }}
{{- $ns = append $ns . }}
{{- end }}
{{- toJson (uniq $ns) }}
{{- end }}

{{/*
CEL: does resource name variable r match one of config.resources.names? A name without
a path.Match meta character is compared exactly; a pattern matches by the literal prefix
before its first meta character (nvidia.com/mig-* -> startsWith("nvidia.com/mig-")).
The prefix test may send a few more pods than the pattern would match, never fewer: the
webhook applies the exact pattern itself. Every DeviceClass's implicit extended resource
(deviceclass.resource.kubernetes.io/<class>) is sent too: only the webhook knows which
classes are GPUs.
*/}}
{{- define "gpu-injector.celResourceMatch" -}}
{{- $terms := list }}
{{- range .Values.config.resources.names }}
{{- $prefix := regexReplaceAll "[*?\\[\\\\].*$" . "" }}
{{- if eq $prefix . }}
{{- $terms = append $terms (printf "r == %s" (squote .)) }}
{{- else }}
{{- $terms = append $terms (printf "r.startsWith(%s)" (squote $prefix)) }}
{{- end }}
{{- end }}
{{- $terms = append $terms "r.startsWith('deviceclass.resource.kubernetes.io/')" }}
{{- join " || " $terms }}
{{- end }}

{{/*
Does the cluster serve resource.k8s.io/v1 (DRA, GA in 1.34)? "true" or empty. helm install
and upgrade know the cluster's API versions and answer from them; helm template without a
cluster knows few, so the version decides there as well: 1.34 serves it by default.
*/}}
{{- define "gpu-injector.servesDRA" -}}
{{- if or (.Capabilities.APIVersions.Has "resource.k8s.io/v1") (semverCompare ">=1.34-0" .Capabilities.KubeVersion.Version) }}true{{ end }}
{{- end }}

{{/*
gpu-injector.validateRuntimeInjection: the chart's own rules for the NRI plugin, which the
binary cannot check because they join values of two components.
*/}}
{{- define "gpu-injector.validateRuntimeInjection" -}}
{{- if and .Values.runtimeInjection.enabled (not .Values.nodeprobe.enabled) }}
{{- fail "runtimeInjection.enabled (on by default) needs nodeprobe.enabled: the NRI plugin runs in the probe's pod and injects the plan the probe finds; with nodeprobe.enabled=false, set runtimeInjection.enabled=false too" }}
{{- end }}
{{- if and (eq (.Values.config.driverDelivery | default "PreferRuntime") "Runtime") (not .Values.runtimeInjection.enabled) }}
{{- fail "config.driverDelivery Runtime needs runtimeInjection.enabled: without the NRI plugin no node injects at the runtime, and every GPU pod would get the noLayout action" }}
{{- end }}
{{- end }}

{{/*
gpu-injector.validateImages: reading pods' pull secrets needs a webhook that knows its
caller is the API server. The webhook reads the Secrets a review names in the review's
namespace; anyone who reaches its port unverified could send a review of another
namespace and have it read that namespace's Secrets. The binary sees neither the chart's
NetworkPolicy nor, in its configuration, the client CA: the chart checks.
*/}}
{{- define "gpu-injector.validateImages" -}}
{{- $im := .Values.config.images }}
{{- if and (eq (toString $im.mode) "On") (eq (toString $im.pullSecrets) "Read") (not .Values.webhook.clientCA.enabled) (not .Values.webhook.networkPolicy.enabled) }}
{{- fail "config.images.pullSecrets Read needs the webhook to verify its caller: with it, anyone who reaches the webhook's port could send a review of another namespace and have the webhook read that namespace's Secrets. Set webhook.networkPolicy.enabled=true (with webhook.networkPolicy.apiServerPeers) or webhook.clientCA.enabled=true (with webhook.clientCA.configMap), or config.images.pullSecrets=None" }}
{{- end }}
{{- end }}

{{/*
Is the cluster OpenShift? "true" or empty. auto asks the cluster for the
security.openshift.io/v1 API (SecurityContextConstraints), which helm install and upgrade
know; helm template knows it only from --api-versions.
*/}}
{{/*
gpu-injector.nodeprobe.recursiveReadOnly: "true" where the probe mounts the host root
recursively read-only (nodeprobe.recursiveReadOnly): auto is true but on OpenShift, whose
CRI-O refuses a recursively read-only hostPath that holds its storage root.
*/}}
{{- define "gpu-injector.nodeprobe.recursiveReadOnly" -}}
{{- $v := toString .Values.nodeprobe.recursiveReadOnly }}
{{- if or (eq $v "true") (and (eq $v "auto") (not (include "gpu-injector.openshift" .))) }}true{{ end }}
{{- end }}

{{- define "gpu-injector.openshift" -}}
{{- $v := toString .Values.openshift.enabled }}
{{- if eq $v "true" }}true
{{- else if and (eq $v "auto") (.Capabilities.APIVersions.Has "security.openshift.io/v1") }}true
{{- end }}
{{- end }}

{{/*
The webhook's pod and container security contexts. On OpenShift the restricted-v2 SCC
assigns each namespace its own uid range and refuses a fixed uid or fsGroup outside it:
the user and group are left to the SCC, which sets them from the namespace's range; every
other setting stays. The install and test hooks run with the same.
*/}}
{{- define "gpu-injector.webhook.podSecurityContext" -}}
{{- $sc := deepCopy .Values.webhook.podSecurityContext }}
{{- if include "gpu-injector.openshift" . }}
{{- $_ := unset $sc "runAsUser" }}
{{- $_ := unset $sc "runAsGroup" }}
{{- $_ := unset $sc "fsGroup" }}
{{- $_ := unset $sc "supplementalGroups" }}
{{- end }}
{{- toYaml $sc }}
{{- end }}

{{- define "gpu-injector.webhook.securityContext" -}}
{{- $sc := deepCopy .Values.webhook.securityContext }}
{{- if include "gpu-injector.openshift" . }}
{{- $_ := unset $sc "runAsUser" }}
{{- $_ := unset $sc "runAsGroup" }}
{{- end }}
{{- toYaml $sc }}
{{- end }}

{{- define "gpu-injector.tests.name" -}}
{{- printf "%s-test" (include "gpu-injector.fullname" .) }}
{{- end }}

{{- define "gpu-injector.tests.precheckName" -}}
{{- printf "%s-precheck" (include "gpu-injector.fullname" .) }}
{{- end }}

{{- define "gpu-injector.tests.labels" -}}
{{ include "gpu-injector.labels" . }}
app.kubernetes.io/component: test
{{- end }}

{{- define "gpu-injector.cleanup.name" -}}
{{- printf "%s-cleanup" (include "gpu-injector.fullname" .) }}
{{- end }}

{{- define "gpu-injector.cleanup.labels" -}}
{{ include "gpu-injector.labels" . }}
app.kubernetes.io/component: cleanup
{{- end }}

{{/*
gpu-injector.clusterKnown: "true" where Helm renders for a cluster it asked: helm install,
upgrade and template --validate list every kind the cluster serves as group/version/Kind,
MutatingWebhookConfiguration among them (served since 1.16); helm template without a cluster
lists group/versions only. The served kinds decide rather than a lookup, which would need
the installing user to read Namespaces and is empty wherever a tool renders with
--api-versions from the cluster instead of connecting (Argo CD).
*/}}
{{- define "gpu-injector.clusterKnown" -}}
{{- if .Capabilities.APIVersions.Has "admissionregistration.k8s.io/v1/MutatingWebhookConfiguration" }}true{{ end }}
{{- end }}

{{/*
gpu-injector.kubeFloor.check: fails where .cluster is set and .version is below 1.30, the
release where admissionregistration.k8s.io/v1 serves the ValidatingAdmissionPolicy the chart
always renders (and the webhook's matchConditions turn GA). Without a cluster it renders any
version: helm template assumes an old one when given none, and the user who pipes its output
to gpu-injector config validate wants the configuration, not a refusal.
*/}}
{{- define "gpu-injector.kubeFloor.check" -}}
{{- if and .cluster (not (semverCompare ">=1.30.0-0" .version)) }}
{{- fail (printf "gpu-injector needs Kubernetes 1.30 or later, and this cluster runs %s: the chart's ValidatingAdmissionPolicy needs admissionregistration.k8s.io/v1, GA in 1.30 (1.30 to 1.32 install but are not tested; 1.33 and later are)" .version) }}
{{- end }}
{{- end }}

{{/* gpu-injector.kubeFloor: gpu-injector.kubeFloor.check on the release's cluster. */}}
{{- define "gpu-injector.kubeFloor" -}}
{{- include "gpu-injector.kubeFloor.check" (dict "version" .Capabilities.KubeVersion.Version "cluster" (include "gpu-injector.clusterKnown" .)) }}
{{- end }}
