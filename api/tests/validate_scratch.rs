use gpu_dra_api::validate::{StaticClasses, Validator};
use serde_json::json;
#[test]
fn scratch() {
    let v = Validator::new("gpu.nvidia.com");
    let classes = StaticClasses::new([
        json!({"apiVersion":"resource.k8s.io/v1","kind":"DeviceClass","metadata":{"name":"gpu.nvidia.com"},"spec":{"selectors":[{"cel":{"expression":"device.driver == 'gpu.nvidia.com' && device.attributes['gpu.nvidia.com'].type == 'gpu'"}}],"extendedResourceName":"nvidia.com/gpu"}}),
        json!({"apiVersion":"resource.k8s.io/v1","kind":"DeviceClass","metadata":{"name":"mig.nvidia.com"},"spec":{"selectors":[{"cel":{"expression":"device.driver == 'gpu.nvidia.com' && device.attributes['gpu.nvidia.com'].type == 'mig'"}}]}}),
    ]);
    let objs = [
        json!({"apiVersion":"resource.k8s.io/v1","kind":"ResourceClaimTemplate","metadata":{"name":"shared-gpus"},"spec":{"spec":{"devices":{"requests":[{"name":"ts-gpu","exactly":{"deviceClassName":"gpu.nvidia.com"}},{"name":"mps-gpu","exactly":{"deviceClassName":"gpu.nvidia.com"}}],"config":[{"requests":["ts-gpu"],"opaque":{"driver":"gpu.nvidia.com","parameters":{"apiVersion":"resource.nvidia.com/v1beta1","kind":"GpuConfig","sharing":{"strategy":"TimeSlicing","timeSlicingConfig":{"interval":"Long"}}}}},{"requests":["mps-gpu"],"opaque":{"driver":"gpu.nvidia.com","parameters":{"apiVersion":"resource.nvidia.com/v1beta1","kind":"GpuConfig","sharing":{"strategy":"MPS","mpsConfig":{"defaultActiveThreadPercentage":50,"defaultPinnedDeviceMemoryLimit":"10Gi"}}}}}]}}}}),
        json!({"apiVersion":"resource.k8s.io/v1","kind":"ResourceClaim","metadata":{"name":"bad"},"spec":{"devices":{"requests":[{"name":"mig","exactly":{"deviceClassName":"mig.nvidia.com","selectors":[{"cel":{"expression":"device.attributes['gpu.nvidia.com'].profile == '1g.10gb'"}},{"cel":{"expression":"device.attributes['memory'] >= 40000"}}]}}],"config":[{"requests":["mig", "mgi"],"opaque":{"driver":"gpu.nvidia.com","parameters":{"apiVersion":"resource.nvidia.com/v1beta1","kind":"GpuConfig","sharing":{"strategy":"MPS","mpsConfig":{"defaultActiveThreadPercentage":150, "bogus": 1}}}}},{"opaque":{"driver":"gpu.nvidia.com","parameters":{"apiVersion":"resource.nvidia.com/v1beta1","kind":"GpuConfig","sharing":{"strategy":"MPS","mpsConfig":{"defaultActiveThreadPercentage":150}}}}}],"constraints":[{"matchAttribute":"gpu.nvidia.com/nvlinkDomian"}]}}}),
        json!({"apiVersion":"resource.k8s.io/v1","kind":"ResourceClaim","metadata":{"name":"other"},"spec":{"devices":{"requests":[{"name":"nic","exactly":{"deviceClassName":"nic.example.com","selectors":[{"cel":{"expression":"device.attributes['memory'] >= 1"}}]}}],"config":[{"opaque":{"driver":"nic.example.com","parameters":{"x":1}}}]}}}),
        json!({"apiVersion":"resource.k8s.io/v1beta1","kind":"ResourceClaim","metadata":{"name":"beta"},"spec":{"devices":{"requests":[{"name":"g","deviceClassName":"gpu.nvidia.com","selectors":[{"cel":{"expression":"device.attributes['gpu.nvidia.com'].productName.lowerAscii().matches('^.*a100.*$')"}}]}]}}}),
        json!({"apiVersion":"resource.k8s.io/v1","kind":"DeviceClass","metadata":{"name":"c"},"spec":{"selectors":"oops"}}),
        json!({"apiVersion":"resource.k8s.io/v1","kind":"DeviceClass","metadata":{"name":"c"},"spec":{"selectors":[{"cel":{"expression":"device.driver == 'gpu.nvidia.com' &&"}}]}}),
    ];
    for o in objs {
        let r = v.validate(&o, &classes);
        println!("{}", serde_json::to_string_pretty(&r).unwrap());
    }
}
