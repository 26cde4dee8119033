import './index.css';
import './plan.css';
