-- Argo CD health check for specgate.dev/SpeculativeDeployment.
-- Install: argocd-cm data key "resource.customizations.health.specgate.dev_SpeculativeDeployment".
local hs = {}
if obj.status == nil or obj.status.phase == nil then
  hs.status = "Progressing"
  hs.message = "Waiting for the specgate operator"
  return hs
end
local generation = obj.metadata.generation
if generation ~= nil and obj.status.observedGeneration ~= generation then
  hs.status = "Progressing"
  hs.message = "Waiting for the operator to observe generation " .. tostring(generation)
  return hs
end
local phase = obj.status.phase
local detail = phase
if obj.status.reason ~= nil then
  detail = phase .. " (" .. obj.status.reason .. ")"
end
if obj.status.message ~= nil and obj.status.message ~= "" then
  detail = detail .. ": " .. obj.status.message
end
if phase == "Promoted" then
  hs.status = "Healthy"
elseif phase == "RolledBack" or phase == "Failed" then
  hs.status = "Degraded"
elseif phase == "Paused" then
  hs.status = "Suspended"
else
  hs.status = "Progressing"
end
hs.message = detail
return hs
