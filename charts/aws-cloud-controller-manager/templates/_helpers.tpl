{{/* Name of the DaemonSet and its k8s-app label (upstream: nameOverride). */}}
{{- define "aws-ccm.name" -}}
{{- required "nameOverride must not be empty" .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "aws-ccm.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | quote }}
app.kubernetes.io/name: {{ include "aws-ccm.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: aws-ccm
{{- end -}}

{{/* The value of flag $flag in .Values.args ("" when absent): (list . "--name"). */}}
{{- define "aws-ccm.arg" -}}
{{- $ctx := index . 0 -}}
{{- $flag := index . 1 -}}
{{- $found := "" -}}
{{- range $ctx.Values.args -}}
{{- $a := toString . -}}
{{- if hasPrefix (printf "%s=" $flag) $a -}}
{{- $found = trimPrefix (printf "%s=" $flag) $a -}}
{{- end -}}
{{- end -}}
{{- $found -}}
{{- end -}}

{{/* HTTPS port of health and metrics: --secure-port, else 10258. */}}
{{- define "aws-ccm.securePort" -}}
{{- $p := include "aws-ccm.arg" (list . "--secure-port") -}}
{{- if $p -}}{{ $p }}{{- else -}}10258{{- end -}}
{{- end -}}

{{/* The Lease leader election uses: --leader-elect-resource-name, else the default. */}}
{{- define "aws-ccm.leaseName" -}}
{{- $n := include "aws-ccm.arg" (list . "--leader-elect-resource-name") -}}
{{- if $n -}}{{ $n }}{{- else -}}cloud-controller-manager{{- end -}}
{{- end -}}

{{/* ConfigMap mounted as cloud.conf, "" for none. */}}
{{- define "aws-ccm.cloudConfigMap" -}}
{{- if .Values.cloudConfig.create -}}
{{- .Values.cloudConfig.name -}}
{{- else -}}
{{- .Values.cloudConfig.existingConfigMap -}}
{{- end -}}
{{- end -}}

{{- define "aws-ccm.image" -}}
{{- $img := .Values.image -}}
{{- if $img.digest -}}
{{- if not (regexMatch "^sha256:[0-9a-f]{64}$" $img.digest) -}}
{{- fail (printf "image.digest %q is not sha256:<64 hex digits>; set it to the digest the registry reports, or leave it empty to use image.tag" $img.digest) -}}
{{- end -}}
{{- printf "%s@%s" $img.repository $img.digest -}}
{{- else -}}
{{- printf "%s:%s" $img.repository (default .Chart.AppVersion (toString $img.tag)) -}}
{{- end -}}
{{- end -}}

{{/* cloud.conf lines "Key = value" of one section, sorted; a list repeats the key; empty values are left out. */}}
{{- define "aws-ccm.iniKeys" -}}
{{- $lines := list -}}
{{- range $k, $v := . -}}
{{- if kindIs "slice" $v -}}
{{- range $v -}}
{{- $lines = append $lines (printf "%s = %v" $k .) -}}
{{- end -}}
{{- else if and (not (kindIs "invalid" $v)) (ne (toString $v) "") -}}
{{- $lines = append $lines (printf "%s = %v" $k $v) -}}
{{- end -}}
{{- end -}}
{{- join "\n" $lines -}}
{{- end -}}

{{/* Checks that turn a values mistake into a message naming the value and the fix. */}}
{{- define "aws-ccm.validate" -}}
{{- $provider := include "aws-ccm.arg" (list . "--cloud-provider") -}}
{{- if ne $provider "aws" -}}
{{- fail (printf "args must contain --cloud-provider=aws (found %q); this CCM serves only AWS" $provider) -}}
{{- end -}}
{{- if .Values.irsa.roleArn -}}
{{- if not (regexMatch "^arn:aws[a-z-]*:iam::[0-9]{12}:role/[A-Za-z0-9+=,.@/_-]+$" .Values.irsa.roleArn) -}}
{{- fail (printf "irsa.roleArn %q is not an IAM role ARN (arn:<partition>:iam::<12-digit account>:role/<name>)" .Values.irsa.roleArn) -}}
{{- end -}}
{{- if not (has .Values.irsa.mode (list "projected" "webhook")) -}}
{{- fail (printf "irsa.mode %q is not projected or webhook" .Values.irsa.mode) -}}
{{- end -}}
{{- if hasKey (.Values.serviceAccount.annotations | default dict) "eks.amazonaws.com/role-arn" -}}
{{- fail "irsa.roleArn and serviceAccount.annotations[eks.amazonaws.com/role-arn] both name a role; keep one (irsa.roleArn with irsa.mode=webhook writes that annotation)" -}}
{{- end -}}
{{- range .Values.env -}}
{{- if eq .name "AWS_ROLE_ARN" -}}
{{- fail "irsa.roleArn and env AWS_ROLE_ARN both name a role; keep irsa.roleArn" -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- if and (not .Values.cloudConfig.create) .Values.cloudConfig.global -}}
{{- fail "cloudConfig.global is set but cloudConfig.create is false; set create: true, or put the keys in the ConfigMap named by cloudConfig.existingConfigMap" -}}
{{- end -}}
{{- range $o := .Values.cloudConfig.serviceOverrides -}}
{{- if not $o.name -}}
{{- fail "every cloudConfig.serviceOverrides entry needs a name (the N of [ServiceOverride \"N\"])" -}}
{{- end -}}
{{- range $k := list "Service" "Region" "URL" "SigningRegion" -}}
{{- if not (index $o $k) -}}
{{- fail (printf "cloudConfig.serviceOverrides %q has no %s; Service, Region, URL and SigningRegion are required (docs/cloud-config.md)" (toString $o.name) $k) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* The admission check's Service, and the Secret holding its serving pair. */}}
{{- define "aws-ccm.admissionService" -}}
{{- printf "%s-admission" (include "aws-ccm.name" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "aws-ccm.admissionSecret" -}}
{{- default (printf "%s-admission-tls" (include "aws-ccm.name" .)) .Values.admissionWebhook.existingSecret -}}
{{- end -}}
